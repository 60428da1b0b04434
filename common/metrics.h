/* metrics — counters, gauges and histograms of one daemon, written as Prometheus text
 * (exposition format 0.0.4) and served over HTTP at /metrics on a port of their own.
 *
 * A registry (met_reg) holds metrics registered at startup; each update is one relaxed atomic
 * operation (histograms: two), so hot paths may update from any thread without a lock.
 * A metric is a (name, labels) pair; metrics registered under one name form a family that is
 * written once with its # HELP / # TYPE lines. Names follow [a-zA-Z_:][a-zA-Z0-9_:]*, label
 * names [a-zA-Z_][a-zA-Z0-9_]*; label values are escaped (\\, \", \n) when written.
 *
 * Values that exist only at scrape time (a library's own statistics, one series per node of a
 * changing node list) come from collectors: callbacks run on the scraping thread that write
 * whole families with met_out_*. A collector must not write a family name also registered.
 *
 * Lifetime: handles returned by met_*_new stay valid until met_reg_destroy. Every update call
 * accepts NULL and does nothing, so a daemon whose registration failed still runs.
 * Registration and rendering take the registry's mutex; updates take none. All calls return 0
 * / a count or a negative errno.
 */
#ifndef KVFS_METRICS_H
#define KVFS_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct met_reg;
struct met_counter;
struct met_gauge;
struct met_hist;
struct met_out;
struct met_http;

int met_reg_create(struct met_reg **out);
/* Frees every metric. Stop the HTTP server first. NULL is a no-op. */
void met_reg_destroy(struct met_reg *r);

/* labels: NULL, or {"key", "value", "key2", "value2", NULL}. Registering a name again with other
 * labels adds a series to that family; the same type is required (-EINVAL otherwise, NULL
 * returned). NULL on a bad name, a bad label name or no memory (the reason is logged). */
struct met_counter *met_counter_new(struct met_reg *r, const char *name, const char *help,
				    const char *const labels[]);
void met_counter_add(struct met_counter *c, uint64_t n);
uint64_t met_counter_get(const struct met_counter *c);

struct met_gauge *met_gauge_new(struct met_reg *r, const char *name, const char *help,
				const char *const labels[]);
/* A gauge whose value is fn(ctx) at scrape time (fn runs on the scraping thread). */
struct met_gauge *met_gauge_fn_new(struct met_reg *r, const char *name, const char *help,
				   const char *const labels[], double (*fn)(void *ctx), void *ctx);
void met_gauge_set(struct met_gauge *g, int64_t v);
void met_gauge_add(struct met_gauge *g, int64_t d);

/* Cumulative buckets with the given upper bounds (strictly increasing, at most MET_MAX_BUCKETS;
 * +Inf is implied). bounds NULL: met_latency_bounds (seconds, 50 µs .. 10 s). */
#define MET_MAX_BUCKETS 32
extern const double met_latency_bounds[];
extern const int met_latency_nbounds;
struct met_hist *met_hist_new(struct met_reg *r, const char *name, const char *help,
			      const char *const labels[], const double *bounds, int nbounds);
void met_hist_observe(struct met_hist *h, double v);
/* Observes ns / 1e9 (latency histograms are in seconds, as Prometheus expects). */
void met_hist_observe_ns(struct met_hist *h, uint64_t ns);
/* Observations so far (the sum of every bucket). */
uint64_t met_hist_count(const struct met_hist *h);

/* ---- per-operation request metrics: <prefix>_requests_total{op}, <prefix>_request_errors_total
 * {op} (non-zero status) and <prefix>_request_duration_seconds{op} (histogram) ---- */
struct met_ops;
/* names[i] is op i's label value; n <= 256. The set is owned by the registry. */
int met_ops_new(struct met_reg *r, const char *prefix, const char *const names[], int n,
		struct met_ops **out);
/* Counts one request of op index i (out of range: ignored). err != 0 also counts an error. */
void met_ops_observe(struct met_ops *s, int i, int err, uint64_t ns);

/* ---- collectors ---- */
typedef void (*met_collect_fn)(void *ctx, struct met_out *o);
int met_collector_add(struct met_reg *r, met_collect_fn fn, void *ctx);
/* Starts a family: type is "counter" or "gauge". Then any number of samples of that name. */
void met_out_family(struct met_out *o, const char *name, const char *type, const char *help);
void met_out_sample(struct met_out *o, const char *name, const char *const labels[], double v);

/* The whole exposition text, malloc'd and NUL-terminated (caller frees); *len its length. */
int met_render(struct met_reg *r, char **text, size_t *len);
/* Which families a page shows. Names with a namespace ("vllm:…", as vLLM's dashboards expect)
 * go on a page of their own: promtool lints the ':' (reserved for recording rules), so GET
 * /metrics stays lint-free and GET /metrics/vllm serves the others. */
enum met_page {
	MET_PAGE_ALL = 0,
	MET_PAGE_PLAIN = 1, /* names without ':' (GET /metrics) */
	MET_PAGE_NS = 2,    /* names with ':' (GET /metrics/vllm) */
};
/* met_render of the families on page only. */
int met_render_page(struct met_reg *r, enum met_page page, char **text, size_t *len);

/* ---- HTTP: GET /metrics answers the exposition text (MET_PAGE_PLAIN), GET /metrics/vllm the
 * namespaced families (MET_PAGE_NS); any other path 404, other methods 405.
 * One internal polling thread (libmicrohttpd). ---- */
/* listen is "HOST:PORT" (IPv4 literal or localhost; port 0 = ephemeral). */
int met_http_start(struct met_reg *r, const char *listen, struct met_http **out);
uint16_t met_http_port(const struct met_http *h);
/* Stops serving and joins its thread. NULL is a no-op. */
void met_http_stop(struct met_http *h);

/* For daemons: starts the server when listen is non-empty and, when addr_file is non-empty,
 * writes "HOST:PORT\n" to it atomically (temporary file + rename). *out stays NULL when listen
 * is empty. Logs and returns a negative errno on failure. */
int met_http_serve(struct met_reg *r, const char *listen, const char *addr_file,
		   struct met_http **out);

#endif
