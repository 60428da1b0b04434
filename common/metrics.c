/* Metrics registry and Prometheus text exposition. The HTTP side is in metrics_http.c. */
#define KVFS_LOG_TAG "metrics"
#include "metrics.h"
#include "log.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum met_type { MET_COUNTER, MET_GAUGE, MET_HIST };
static const char *const type_names[] = {"counter", "gauge", "histogram"};

const double met_latency_bounds[] = {50e-6,  100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3,
				     5e-3,   10e-3,  25e-3,  50e-3,  100e-3, 250e-3,
				     500e-3, 1,	     2.5,    5,	     10};
const int met_latency_nbounds = (int)(sizeof(met_latency_bounds) / sizeof(double));

struct met_series {
	struct met_series *next;
	char *labels; /* rendered: k="v",k2="v2" (escaped) or "" */
};

struct met_counter {
	struct met_series s;
	_Atomic uint64_t v;
};

struct met_gauge {
	struct met_series s;
	_Atomic int64_t v;
	double (*fn)(void *ctx);
	void *ctx;
};

struct met_hist {
	struct met_series s;
	int nb;
	double bounds[MET_MAX_BUCKETS];
	_Atomic uint64_t buckets[MET_MAX_BUCKETS + 1]; /* not cumulative; last is +Inf */
	_Atomic uint64_t sum_bits;		       /* a double, updated by CAS */
};

struct met_family {
	struct met_family *next;
	enum met_type type;
	char *name, *help;
	struct met_series *first, **tail; /* registration order */
};

struct met_collector {
	struct met_collector *next;
	met_collect_fn fn;
	void *ctx;
};

struct met_ops {
	struct met_ops *next;
	int n;
	struct met_counter **req, **err;
	struct met_hist **lat;
};

struct met_reg {
	pthread_mutex_t mu; /* protects everything below; updates need no lock */
	struct met_family *fams, **fams_tail;
	struct met_collector *cols, **cols_tail;
	struct met_ops *ops;
};

/* ---- growable text buffer with a sticky error ---- */
struct met_out {
	char *p;
	size_t len, cap;
	int err;
	const char *family; /* a collector's current family, to check sample names */
	enum met_page page;
	int skip; /* the current family is not on this page */
};

/* Whether a family belongs on page: vLLM-style "ns:name" families have a page of their own
 * (promtool lints a ':' in a name; Prometheus reserves it for recording rules). */
static int on_page(enum met_page page, const char *name)
{
	int ns = strchr(name, ':') != NULL;
	return page == MET_PAGE_ALL || (page == MET_PAGE_NS) == ns;
}

static void out_printf(struct met_out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void out_printf(struct met_out *o, const char *fmt, ...)
{
	if (o->err)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->err = -EINVAL;
			return;
		}
		if ((size_t)n < o->cap - o->len) {
			o->len += (size_t)n;
			return;
		}
		size_t cap = o->cap * 2 + (size_t)n + 1;
		char *p = realloc(o->p, cap);
		if (!p) {
			o->err = -ENOMEM;
			return;
		}
		o->p = p;
		o->cap = cap;
	}
}

/* Prometheus number: integers exactly, +Inf/-Inf/NaN spelled its way. */
static void out_value(struct met_out *o, double v)
{
	if (isnan(v))
		out_printf(o, "NaN");
	else if (isinf(v))
		out_printf(o, v > 0 ? "+Inf" : "-Inf");
	else if (v == (double)(int64_t)v && fabs(v) < 9e15)
		out_printf(o, "%lld", (long long)v);
	else {
		/* the shortest of %.15g..%.17g that reads back exactly: le="0.0025", not
		 * le="0.0025000000000000001" */
		char b[40];
		for (int prec = 15; prec <= 17; prec++) {
			snprintf(b, sizeof(b), "%.*g", prec, v);
			if (strtod(b, NULL) == v)
				break;
		}
		out_printf(o, "%s", b);
	}
}

/* HELP text escapes \ and newline; label values also escape ". */
static void out_escaped(struct met_out *o, const char *s, int quote)
{
	for (; *s; s++) {
		if (*s == '\\')
			out_printf(o, "\\\\");
		else if (*s == '\n')
			out_printf(o, "\\n");
		else if (*s == '"' && quote)
			out_printf(o, "\\\"");
		else
			out_printf(o, "%c", *s);
	}
}

static int valid_name(const char *s, int colon)
{
	if (!s || !*s)
		return 0;
	for (const char *p = s; *p; p++) {
		int alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
			    (colon && *p == ':');
		if (!alpha && !(p > s && *p >= '0' && *p <= '9'))
			return 0;
	}
	return 1;
}

/* Renders labels into a malloc'd string; NULL on a bad label name or no memory. */
static char *render_labels(const char *const labels[])
{
	struct met_out o = {0};
	out_printf(&o, "%s", "");
	for (int i = 0; labels && labels[i]; i += 2) {
		if (!valid_name(labels[i], 0) || !labels[i + 1] ||
		    strncmp(labels[i], "__", 2) == 0) {
			free(o.p);
			return NULL;
		}
		out_printf(&o, "%s%s=\"", i ? "," : "", labels[i]);
		out_escaped(&o, labels[i + 1], 1);
		out_printf(&o, "\"");
	}
	if (o.err) {
		free(o.p);
		return NULL;
	}
	return o.p;
}

int met_reg_create(struct met_reg **out)
{
	struct met_reg *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->mu, NULL);
	r->fams_tail = &r->fams;
	r->cols_tail = &r->cols;
	*out = r;
	return 0;
}

void met_reg_destroy(struct met_reg *r)
{
	if (!r)
		return;
	while (r->fams) {
		struct met_family *f = r->fams;
		r->fams = f->next;
		while (f->first) {
			struct met_series *s = f->first;
			f->first = s->next;
			free(s->labels);
			free(s); /* every series struct starts with its met_series */
		}
		free(f->name);
		free(f->help);
		free(f);
	}
	while (r->cols) {
		struct met_collector *c = r->cols;
		r->cols = c->next;
		free(c);
	}
	while (r->ops) {
		struct met_ops *s = r->ops;
		r->ops = s->next;
		free(s->req);
		free(s->err);
		free(s->lat);
		free(s);
	}
	pthread_mutex_destroy(&r->mu);
	free(r);
}

/* Adds series s (size bytes, zeroed but for labels) to family name; returns it or NULL. */
static void *add_series(struct met_reg *r, enum met_type t, const char *name, const char *help,
			const char *const labels[], size_t size)
{
	if (!r)
		return NULL;
	if (!valid_name(name, 1)) {
		klog_error("bad metric name '%s'", name ? name : "(null)");
		return NULL;
	}
	struct met_series *s = calloc(1, size);
	char *lab = render_labels(labels);
	if (!s || !lab) {
		klog_error("metric %s: bad labels or no memory", name);
		free(s);
		free(lab);
		return NULL;
	}
	s->labels = lab;
	pthread_mutex_lock(&r->mu);
	struct met_family *f = r->fams;
	while (f && strcmp(f->name, name))
		f = f->next;
	if (f && f->type != t) {
		pthread_mutex_unlock(&r->mu);
		klog_error("metric %s registered again with another type", name);
		free(lab);
		free(s);
		return NULL;
	}
	for (struct met_series *o = f ? f->first : NULL; o; o = o->next) {
		if (strcmp(o->labels, lab) == 0) {
			pthread_mutex_unlock(&r->mu);
			klog_error("metric %s{%s} registered twice", name, lab);
			free(lab);
			free(s);
			return NULL;
		}
	}
	if (!f) {
		f = calloc(1, sizeof(*f));
		if (f) {
			f->name = strdup(name);
			f->help = strdup(help ? help : "");
		}
		if (!f || !f->name || !f->help) {
			pthread_mutex_unlock(&r->mu);
			if (f) {
				free(f->name);
				free(f->help);
			}
			free(f);
			free(lab);
			free(s);
			return NULL;
		}
		f->type = t;
		f->tail = &f->first;
		*r->fams_tail = f;
		r->fams_tail = &f->next;
	}
	*f->tail = s;
	f->tail = &s->next;
	pthread_mutex_unlock(&r->mu);
	return s;
}

struct met_counter *met_counter_new(struct met_reg *r, const char *name, const char *help,
				    const char *const labels[])
{
	return add_series(r, MET_COUNTER, name, help, labels, sizeof(struct met_counter));
}

void met_counter_add(struct met_counter *c, uint64_t n)
{
	if (c)
		atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed);
}

uint64_t met_counter_get(const struct met_counter *c)
{
	return c ? atomic_load_explicit(&c->v, memory_order_relaxed) : 0;
}

struct met_gauge *met_gauge_new(struct met_reg *r, const char *name, const char *help,
				const char *const labels[])
{
	return add_series(r, MET_GAUGE, name, help, labels, sizeof(struct met_gauge));
}

struct met_gauge *met_gauge_fn_new(struct met_reg *r, const char *name, const char *help,
				   const char *const labels[], double (*fn)(void *ctx), void *ctx)
{
	if (!fn)
		return NULL;
	/* Set under the mutex that render reads it under; until then the gauge reads 0. */
	struct met_gauge *g = add_series(r, MET_GAUGE, name, help, labels, sizeof(*g));
	if (g) {
		pthread_mutex_lock(&r->mu);
		g->fn = fn;
		g->ctx = ctx;
		pthread_mutex_unlock(&r->mu);
	}
	return g;
}

void met_gauge_set(struct met_gauge *g, int64_t v)
{
	if (g)
		atomic_store_explicit(&g->v, v, memory_order_relaxed);
}

void met_gauge_add(struct met_gauge *g, int64_t d)
{
	if (g)
		atomic_fetch_add_explicit(&g->v, d, memory_order_relaxed);
}

struct met_hist *met_hist_new(struct met_reg *r, const char *name, const char *help,
			      const char *const labels[], const double *bounds, int nbounds)
{
	if (!bounds) {
		bounds = met_latency_bounds;
		nbounds = met_latency_nbounds;
	}
	if (nbounds < 1 || nbounds > MET_MAX_BUCKETS)
		return NULL;
	for (int i = 0; i < nbounds; i++)
		if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1]))
			return NULL;
	/* Set under the mutex render holds; a scrape before that sees nb 0 (one +Inf bucket).
	 * Observers only get the handle after this returns. */
	struct met_hist *h = add_series(r, MET_HIST, name, help, labels, sizeof(*h));
	if (h) {
		pthread_mutex_lock(&r->mu);
		h->nb = nbounds;
		memcpy(h->bounds, bounds, sizeof(double) * (size_t)nbounds);
		pthread_mutex_unlock(&r->mu);
	}
	return h;
}

void met_hist_observe(struct met_hist *h, double v)
{
	if (!h || isnan(v))
		return;
	int i = 0;
	while (i < h->nb && v > h->bounds[i])
		i++;
	uint64_t old = atomic_load_explicit(&h->sum_bits, memory_order_relaxed), nw;
	do {
		double d;
		memcpy(&d, &old, sizeof(d));
		d += v;
		memcpy(&nw, &d, sizeof(nw));
	} while (!atomic_compare_exchange_weak_explicit(
	    &h->sum_bits, &old, nw, memory_order_relaxed, memory_order_relaxed));
	atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
}

void met_hist_observe_ns(struct met_hist *h, uint64_t ns)
{
	met_hist_observe(h, (double)ns / 1e9);
}

uint64_t met_hist_count(const struct met_hist *h)
{
	uint64_t n = 0;
	for (int i = 0; h && i <= h->nb; i++)
		n += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
	return n;
}

int met_ops_new(struct met_reg *r, const char *prefix, const char *const names[], int n,
		struct met_ops **out)
{
	if (!r || !prefix || n < 1 || n > 256)
		return -EINVAL;
	struct met_ops *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->n = n;
	s->req = calloc((size_t)n, sizeof(*s->req));
	s->err = calloc((size_t)n, sizeof(*s->err));
	s->lat = calloc((size_t)n, sizeof(*s->lat));
	if (!s->req || !s->err || !s->lat) {
		free(s->req);
		free(s->err);
		free(s->lat);
		free(s);
		return -ENOMEM;
	}
	char nreq[160], nerr[160], nlat[160];
	snprintf(nreq, sizeof(nreq), "%s_requests_total", prefix);
	snprintf(nerr, sizeof(nerr), "%s_request_errors_total", prefix);
	snprintf(nlat, sizeof(nlat), "%s_request_duration_seconds", prefix);
	for (int i = 0; i < n; i++) {
		if (!names[i])
			continue;
		const char *lab[] = {"op", names[i], NULL};
		s->req[i] = met_counter_new(r, nreq, "Requests answered, by operation", lab);
		s->err[i] = met_counter_new(r, nerr, "Requests answered with an error", lab);
		s->lat[i] =
		    met_hist_new(r, nlat, "Time from request to reply, by operation", lab, NULL, 0);
	}
	pthread_mutex_lock(&r->mu);
	s->next = r->ops;
	r->ops = s;
	pthread_mutex_unlock(&r->mu);
	*out = s;
	return 0;
}

void met_ops_observe(struct met_ops *s, int i, int err, uint64_t ns)
{
	if (!s || i < 0 || i >= s->n)
		return;
	met_counter_add(s->req[i], 1);
	if (err)
		met_counter_add(s->err[i], 1);
	met_hist_observe_ns(s->lat[i], ns);
}

int met_collector_add(struct met_reg *r, met_collect_fn fn, void *ctx)
{
	if (!r || !fn)
		return -EINVAL;
	struct met_collector *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fn = fn;
	c->ctx = ctx;
	pthread_mutex_lock(&r->mu);
	*r->cols_tail = c;
	r->cols_tail = &c->next;
	pthread_mutex_unlock(&r->mu);
	return 0;
}

static void out_header(struct met_out *o, const char *name, const char *type, const char *help)
{
	out_printf(o, "# HELP %s ", name);
	out_escaped(o, help ? help : "", 0);
	out_printf(o, "\n# TYPE %s %s\n", name, type);
}

void met_out_family(struct met_out *o, const char *name, const char *type, const char *help)
{
	if (!valid_name(name, 1) || !type || (strcmp(type, "counter") && strcmp(type, "gauge"))) {
		o->err = o->err ? o->err : -EINVAL;
		return;
	}
	o->family = name;
	o->skip = !on_page(o->page, name);
	if (!o->skip)
		out_header(o, name, type, help);
}

void met_out_sample(struct met_out *o, const char *name, const char *const labels[], double v)
{
	if (!o->family || !name || strcmp(name, o->family)) {
		o->err = o->err ? o->err : -EINVAL;
		return;
	}
	if (o->skip)
		return;
	char *lab = render_labels(labels);
	if (!lab) {
		o->err = o->err ? o->err : -EINVAL;
		return;
	}
	out_printf(o, *lab ? "%s{%s} " : "%s%s ", name, lab);
	out_value(o, v);
	out_printf(o, "\n");
	free(lab);
}

static void render_hist(struct met_out *o, const char *name, const struct met_hist *h)
{
	const char *lab = h->s.labels, *sep = *lab ? "," : "";
	uint64_t cum = 0;
	for (int i = 0; i <= h->nb; i++) {
		cum += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
		out_printf(o, "%s_bucket{%s%sle=\"", name, lab, sep);
		out_value(o, i < h->nb ? h->bounds[i] : INFINITY);
		out_printf(o, "\"} %llu\n", (unsigned long long)cum);
	}
	uint64_t bits = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
	double sum;
	memcpy(&sum, &bits, sizeof(sum));
	out_printf(o, *lab ? "%s_sum{%s} " : "%s_sum%s ", name, lab);
	out_value(o, sum);
	/* _count is the +Inf bucket by construction, so the two always agree. */
	out_printf(o, *lab ? "\n%s_count{%s} %llu\n" : "\n%s_count%s %llu\n", name, lab,
		   (unsigned long long)cum);
}

int met_render(struct met_reg *r, char **text, size_t *len)
{
	return met_render_page(r, MET_PAGE_ALL, text, len);
}

int met_render_page(struct met_reg *r, enum met_page page, char **text, size_t *len)
{
	struct met_out o = {.page = page};
	out_printf(&o, "%s", "");
	pthread_mutex_lock(&r->mu);
	for (struct met_family *f = r->fams; f; f = f->next) {
		if (!on_page(page, f->name))
			continue;
		out_header(&o, f->name, type_names[f->type], f->help);
		for (struct met_series *s = f->first; s; s = s->next) {
			if (f->type == MET_HIST) {
				render_hist(&o, f->name, (const struct met_hist *)s);
				continue;
			}
			double v;
			if (f->type == MET_COUNTER) {
				v = (double)met_counter_get((const struct met_counter *)s);
			} else {
				struct met_gauge *g = (struct met_gauge *)s;
				v = g->fn
					? g->fn(g->ctx)
					: (double)atomic_load_explicit(&g->v, memory_order_relaxed);
			}
			out_printf(&o, *s->labels ? "%s{%s} " : "%s%s ", f->name, s->labels);
			out_value(&o, v);
			out_printf(&o, "\n");
		}
	}
	for (struct met_collector *c = r->cols; c; c = c->next) {
		o.family = NULL;
		c->fn(c->ctx, &o);
	}
	pthread_mutex_unlock(&r->mu);
	if (o.err) {
		free(o.p);
		return o.err;
	}
	*text = o.p;
	*len = o.len;
	return 0;
}
