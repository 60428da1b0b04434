/* prom_parse — a strict parser of Prometheus text exposition (format 0.0.4) for tests, plus an
 * HTTP GET over a plain socket. Strict: only # HELP / # TYPE comments, HELP then TYPE once per
 * family before its samples (a HELP not followed by its TYPE fails), a family's samples
 * contiguous and named after it, no timestamps, no duplicate series, valid names, labels and
 * numbers; every histogram series has buckets in increasing `le` with non-decreasing counts, an
 * le="+Inf" bucket equal to its _count, and a _sum. Not thread-safe per doc.
 */
#ifndef KVFS_PROM_PARSE_H
#define KVFS_PROM_PARSE_H

#include <stddef.h>

struct prom_sample {
	char name[128];
	char labels[512]; /* as written between the braces (escapes kept); "" if none */
	double v;
};

struct prom_doc {
	struct prom_sample *s;
	int n;
	char err[256]; /* why parsing failed */
};

/* 0, or -EINVAL with doc->err naming the line and the problem. Free with prom_free. */
int prom_parse(const char *text, struct prom_doc *doc);
void prom_free(struct prom_doc *doc);

/* Value of the series name{labels} (labels exactly as written, "" for none); -ENOENT if absent. */
int prom_get(const struct prom_doc *doc, const char *name, const char *labels, double *v);
/* Sum of every series of this sample name whose labels contain `part` (NULL: all); the number of
 * matching series in *n (may be NULL). */
double prom_sum(const struct prom_doc *doc, const char *name, const char *part, int *n);

/* 0 when text has exactly one "# HELP name " line and one "# TYPE name " line, else -EINVAL. */
int prom_family_once(const char *text, const char *name);

/* Runs `promtool check metrics` on text, when promtool is on PATH (Debian: apt-get install
 * prometheus). 0: it found nothing; 1: promtool is not installed (the caller says it skipped
 * the check); -EINVAL: a parse
 * error or another lint problem, promtool's words in why (n bytes); another negative errno when
 * it could not be run. */
int prom_promtool(const char *text, char *why, size_t n);
/* prom_promtool, ignoring the complaint lines that contain tolerated (NULL: none), e.g. "should
 * not contain ':'" for vLLM's namespaced names on /metrics/vllm. */
int prom_promtool_except(const char *text, const char *tolerated, char *why, size_t n);

/* Checks a whole /metrics page for a test: prom_parse, each of fams[0..n) declared by exactly
 * one HELP and one TYPE (prom_family_once), then prom_promtool. 0, or a negative errno with why
 * (wn bytes) saying what failed; *promtool_ran is 0 when promtool is not installed (the caller
 * says the promtool part was skipped). */
int prom_check_page(const char *text, const char *const fams[], int n, int *promtool_ran, char *why,
		    size_t wn);

/* GET http://addr<path>; returns the HTTP status (200...) and the body (malloc'd, NUL-terminated,
 * caller frees), or a negative errno. */
int prom_http_get(const char *addr, const char *path, char **body);

#endif
