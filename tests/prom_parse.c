/* Strict Prometheus text parser for tests (see prom_parse.h). */
#include "prom_parse.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/time.h>
#include <unistd.h>

enum { T_NONE, T_COUNTER, T_GAUGE, T_HIST };

static int fail(struct prom_doc *d, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct prom_doc *d, int line, const char *fmt, ...)
{
	int n = snprintf(d->err, sizeof(d->err), "line %d: ", line);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(d->err + n, sizeof(d->err) - (size_t)n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int name_char(char c, int first)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
	       (!first && c >= '0' && c <= '9');
}

/* Reads a metric name at *p into out; returns its length (0 = none). */
static size_t read_name(const char **p, char *out, size_t cap)
{
	size_t n = 0;
	while (name_char((*p)[n], n == 0))
		n++;
	if (n == 0 || n >= cap)
		return 0;
	memcpy(out, *p, n);
	out[n] = 0;
	*p += n;
	return n;
}

static int parse_value(const char *s, double *v)
{
	if (!strcmp(s, "+Inf") || !strcmp(s, "Inf")) {
		*v = INFINITY;
		return 0;
	}
	if (!strcmp(s, "-Inf")) {
		*v = -INFINITY;
		return 0;
	}
	if (!strcmp(s, "NaN")) {
		*v = NAN;
		return 0;
	}
	char *end;
	if (!*s || isspace((unsigned char)*s))
		return -1;
	*v = strtod(s, &end);
	return *end ? -1 : 0;
}

/* Checks the label block {...} at *p (p at '{'); copies the inside to out; extracts le. */
static int read_labels(const char **p, char *out, size_t cap, char *le, size_t lecap,
		       const char **why)
{
	const char *s = *p + 1, *start = s;
	*le = 0;
	int first = 1;
	while (*s != '}') {
		if (!first) {
			if (*s != ',') {
				*why = "expected ',' between labels";
				return -1;
			}
			s++;
		}
		first = 0;
		const char *ln = s;
		if (!name_char(*s, 1) || *s == ':') {
			*why = "bad label name";
			return -1;
		}
		while (name_char(*s, 0) && *s != ':')
			s++;
		int is_le = (s - ln == 2 && !strncmp(ln, "le", 2));
		if (*s++ != '=' || *s++ != '"') {
			*why = "expected =\" after a label name";
			return -1;
		}
		size_t vn = 0;
		while (*s != '"') {
			if (!*s || *s == '\n') {
				*why = "unterminated label value";
				return -1;
			}
			if (*s == '\\') {
				s++;
				if (*s != '\\' && *s != '"' && *s != 'n') {
					*why = "bad escape in a label value";
					return -1;
				}
			}
			if (is_le && vn + 1 < lecap)
				le[vn++] = *s;
			s++;
		}
		if (is_le)
			le[vn] = 0;
		s++;
	}
	size_t n = (size_t)(s - start);
	if (n >= cap) {
		*why = "labels too long";
		return -1;
	}
	memcpy(out, start, n);
	out[n] = 0;
	*p = s + 1;
	return 0;
}

/* The labels without the le pair, for grouping a histogram's buckets. */
static void strip_le(const char *labels, char *out, size_t cap)
{
	const char *le = strstr(labels, "le=\"");
	while (le && le != labels && le[-1] != ',')
		le = strstr(le + 1, "le=\"");
	if (!le) {
		snprintf(out, cap, "%s", labels);
		return;
	}
	const char *end = strchr(le + 4, '"') + 1;
	if (*end == ',')
		end++;
	snprintf(out, cap, "%.*s%s", (int)(le - labels), labels, end);
	size_t n = strlen(out);
	if (n && out[n - 1] == ',')
		out[n - 1] = 0;
}

static int check_hist(struct prom_doc *d, int from, int to, const char *fam, int line)
{
	char bname[160], cname[160], sname[160];
	snprintf(bname, sizeof(bname), "%s_bucket", fam);
	snprintf(cname, sizeof(cname), "%s_count", fam);
	snprintf(sname, sizeof(sname), "%s_sum", fam);
	for (int i = from; i < to; i++) {
		if (strcmp(d->s[i].name, cname))
			continue;
		/* for each _count: its buckets and sum */
		double last_le = -INFINITY, last_c = 0, inf_c = -1;
		int nb = 0, have_sum = 0;
		for (int j = from; j < to; j++) {
			char base[512];
			if (!strcmp(d->s[j].name, sname) && !strcmp(d->s[j].labels, d->s[i].labels))
				have_sum = 1;
			if (strcmp(d->s[j].name, bname))
				continue;
			strip_le(d->s[j].labels, base, sizeof(base));
			if (strcmp(base, d->s[i].labels))
				continue;
			const char *lp = strstr(d->s[j].labels, "le=\"");
			double le;
			char lev[64];
			snprintf(lev, sizeof(lev), "%.*s", (int)strcspn(lp + 4, "\""), lp + 4);
			if (parse_value(lev, &le))
				return fail(d, line, "%s: bad le \"%s\"", fam, lev);
			if (le <= last_le)
				return fail(d, line, "%s{%s}: le not increasing", fam, base);
			if (d->s[j].v < last_c)
				return fail(d, line, "%s{%s}: bucket counts decrease", fam, base);
			last_le = le;
			last_c = d->s[j].v;
			nb++;
			if (isinf(le))
				inf_c = d->s[j].v;
		}
		if (!nb || inf_c < 0)
			return fail(d, line, "%s{%s}: no le=\"+Inf\" bucket", fam, d->s[i].labels);
		if (inf_c != d->s[i].v)
			return fail(d, line, "%s{%s}: +Inf bucket %g != _count %g", fam,
				    d->s[i].labels, inf_c, d->s[i].v);
		if (!have_sum)
			return fail(d, line, "%s{%s}: no _sum", fam, d->s[i].labels);
	}
	for (int j = from; j < to; j++) /* every bucket has a count */
		if (!strcmp(d->s[j].name, bname)) {
			char base[512];
			double v;
			strip_le(d->s[j].labels, base, sizeof(base));
			if (prom_get(d, cname, base, &v))
				return fail(d, line, "%s{%s}: buckets without _count", fam, base);
		}
	return 0;
}

int prom_parse(const char *text, struct prom_doc *d)
{
	memset(d, 0, sizeof(*d));
	char fam[128] = "", help_for[128] = "", seen[4096] = " ";
	int type = T_NONE, fam_start = 0, cap = 0, line = 0;
	const char *p = text;
	while (*p) {
		line++;
		const char *eol = strchr(p, '\n');
		if (!eol)
			return fail(d, line, "last line has no newline");
		char buf[1024];
		size_t n = (size_t)(eol - p);
		if (n >= sizeof(buf))
			return fail(d, line, "line too long");
		memcpy(buf, p, n);
		buf[n] = 0;
		p = eol + 1;
		if (n == 0)
			return fail(d, line, "empty line");
		if (buf[0] == '#') {
			char nm[128];
			const char *q = buf + 7;
			if (!strncmp(buf, "# HELP ", 7)) {
				if (!read_name(&q, nm, sizeof(nm)) || *q != ' ')
					return fail(d, line, "bad HELP line");
				if (help_for[0])
					return fail(d, line,
						    "HELP %s after HELP %s, no TYPE between", nm,
						    help_for);
				snprintf(help_for, sizeof(help_for), "%s", nm);
				continue;
			}
			if (strncmp(buf, "# TYPE ", 7) || !read_name(&q, nm, sizeof(nm)) ||
			    *q != ' ')
				return fail(d, line, "only # HELP and # TYPE comments expected");
			q++;
			if (type == T_HIST && check_hist(d, fam_start, d->n, fam, line))
				return -EINVAL;
			if (strcmp(help_for, nm))
				return fail(d, line, "TYPE %s without its HELP just before", nm);
			char key[140];
			snprintf(key, sizeof(key), " %s ", nm);
			if (strstr(seen, key))
				return fail(d, line, "family %s declared twice", nm);
			if (strlen(seen) + strlen(key) < sizeof(seen))
				strcat(seen, key + 1);
			type = !strcmp(q, "counter")	 ? T_COUNTER
			       : !strcmp(q, "gauge")	 ? T_GAUGE
			       : !strcmp(q, "histogram") ? T_HIST
							 : T_NONE;
			if (type == T_NONE)
				return fail(d, line, "unknown type '%s'", q);
			snprintf(fam, sizeof(fam), "%s", nm);
			help_for[0] = 0;
			fam_start = d->n;
			continue;
		}
		if (type == T_NONE)
			return fail(d, line, "sample before any # TYPE");
		if (d->n == cap) {
			cap = cap ? cap * 2 : 256;
			struct prom_sample *s = realloc(d->s, sizeof(*s) * (size_t)cap);
			if (!s)
				return -ENOMEM;
			d->s = s;
		}
		struct prom_sample *s = &d->s[d->n];
		const char *q = buf, *why = NULL;
		char le[64] = "";
		if (!read_name(&q, s->name, sizeof(s->name)))
			return fail(d, line, "bad metric name");
		s->labels[0] = 0;
		if (*q == '{' &&
		    read_labels(&q, s->labels, sizeof(s->labels), le, sizeof(le), &why))
			return fail(d, line, "%s", why);
		if (*q++ != ' ')
			return fail(d, line, "expected one space before the value");
		if (strchr(q, ' '))
			return fail(d, line, "timestamp or trailing text not expected");
		if (parse_value(q, &s->v))
			return fail(d, line, "bad value '%s'", q);
		size_t fl = strlen(fam);
		const char *suf = !strncmp(s->name, fam, fl) ? s->name + fl : NULL;
		int ok = suf && (type == T_HIST ? (!strcmp(suf, "_bucket") ||
						   !strcmp(suf, "_sum") || !strcmp(suf, "_count"))
						: !*suf);
		if (!ok)
			return fail(d, line, "sample %s outside its family %s", s->name, fam);
		if (type == T_HIST && !strcmp(suf, "_bucket") && !le[0])
			return fail(d, line, "bucket without le");
		if (type == T_COUNTER && !(s->v >= 0))
			return fail(d, line, "counter %s is negative or NaN", s->name);
		double v;
		if (!prom_get(d, s->name, s->labels, &v))
			return fail(d, line, "duplicate series %s{%s}", s->name, s->labels);
		d->n++;
	}
	if (type == T_HIST && check_hist(d, fam_start, d->n, fam, line))
		return -EINVAL;
	return 0;
}

void prom_free(struct prom_doc *d)
{
	free(d->s);
	d->s = NULL;
	d->n = 0;
}

int prom_get(const struct prom_doc *d, const char *name, const char *labels, double *v)
{
	for (int i = 0; i < d->n; i++)
		if (!strcmp(d->s[i].name, name) && !strcmp(d->s[i].labels, labels ? labels : "")) {
			*v = d->s[i].v;
			return 0;
		}
	return -ENOENT;
}

double prom_sum(const struct prom_doc *d, const char *name, const char *part, int *n)
{
	double sum = 0;
	int k = 0;
	for (int i = 0; i < d->n; i++)
		if (!strcmp(d->s[i].name, name) && (!part || strstr(d->s[i].labels, part))) {
			sum += d->s[i].v;
			k++;
		}
	if (n)
		*n = k;
	return sum;
}

int prom_http_get(const char *addr, const char *path, char **body)
{
	char host[64];
	const char *colon = strrchr(addr, ':');
	if (!colon || colon - addr >= (long)sizeof(host))
		return -EINVAL;
	snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)atoi(colon + 1))};
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return -EINVAL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct timeval tv = {.tv_sec = 10};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int e = -errno;
		close(fd);
		return e;
	}
	char req[512];
	int rn = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr);
	if (write(fd, req, (size_t)rn) != rn) {
		close(fd);
		return -EIO;
	}
	size_t len = 0, cap = 65536;
	char *b = malloc(cap);
	for (;;) {
		if (!b) {
			close(fd);
			return -ENOMEM;
		}
		if (len + 1 >= cap) {
			char *nb = realloc(b, cap *= 2);
			if (!nb)
				free(b);
			b = nb;
			continue;
		}
		ssize_t r = read(fd, b + len, cap - len - 1);
		if (r < 0) {
			int e = -errno;
			free(b);
			close(fd);
			return e;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	b[len] = 0;
	int status = 0;
	char *sep = strstr(b, "\r\n\r\n");
	if (sscanf(b, "HTTP/1.%*d %d", &status) != 1 || !sep) {
		free(b);
		return -EPROTO;
	}
	memmove(b, sep + 4, len - (size_t)(sep + 4 - b) + 1);
	*body = b;
	return status;
}

int prom_promtool(const char *text, char *why, size_t n)
{
	return prom_promtool_except(text, NULL, why, n);
}

int prom_promtool_except(const char *text, const char *tolerated, char *why, size_t n)
{
	why[0] = 0;
	if (system("command -v promtool >/dev/null 2>&1") != 0)
		return 1;
	char path[] = "/tmp/prom_parse.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		return -errno;
	size_t len = strlen(text);
	int ok = write(fd, text, len) == (ssize_t)len;
	close(fd);
	if (!ok) {
		unlink(path);
		return -EIO;
	}
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
	FILE *p = popen(cmd, "r");
	if (!p) {
		unlink(path);
		return -errno;
	}
	/* Exit 1: a parse error; 3: lint problems, one a line: every one fails. */
	char line[512];
	int bad = 0;
	size_t used = 0;
	while (fgets(line, sizeof(line), p)) {
		if (tolerated && strstr(line, tolerated))
			continue;
		bad = 1;
		if (used + 1 < n) {
			snprintf(why + used, n - used, "%s", line);
			used += strlen(why + used);
		}
	}
	int st = pclose(p);
	unlink(path);
	if (st == -1 || !WIFEXITED(st))
		return -ECHILD;
	int rc = WEXITSTATUS(st);
	if (rc == 1 || (rc == 3 && bad) || (rc != 0 && rc != 3)) {
		if (!why[0])
			snprintf(why, n, "promtool exited %d", rc);
		return -EINVAL;
	}
	return 0;
}

/* Occurrences of the line that starts with prefix. */
static int count_lines(const char *text, const char *prefix)
{
	int k = 0;
	size_t n = strlen(prefix);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		k += strncmp(p, prefix, n) == 0;
	return k;
}

int prom_family_once(const char *text, const char *name)
{
	char help[160], type[160];
	snprintf(help, sizeof(help), "# HELP %s ", name);
	snprintf(type, sizeof(type), "# TYPE %s ", name);
	return count_lines(text, help) == 1 && count_lines(text, type) == 1 ? 0 : -EINVAL;
}

int prom_check_page(const char *text, const char *const fams[], int n, int *promtool_ran, char *why,
		    size_t wn)
{
	struct prom_doc d;
	*promtool_ran = 0;
	if (prom_parse(text, &d)) {
		snprintf(why, wn, "%s", d.err);
		return -EINVAL;
	}
	prom_free(&d);
	for (int i = 0; i < n; i++)
		if (prom_family_once(text, fams[i])) {
			snprintf(why, wn, "family %s: not one HELP and one TYPE", fams[i]);
			return -EINVAL;
		}
	int rc = prom_promtool(text, why, wn);
	*promtool_ran = rc != 1;
	return rc == 1 ? 0 : rc;
}
