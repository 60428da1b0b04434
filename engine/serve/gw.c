#define KVFS_LOG_TAG "gateway"
#include "gw.h"
#include "gw_auth.h"
#include "gw_net.h"
#include "ktime.h"
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/* kvfs_requests_total's outcome label: every request answered is counted once. */
enum gw_outcome { GW_OK, GW_CLIENT_ERR, GW_SERVER_ERR, GW_CANCELLED, GW_OUT_N };
static const char *const outcome_names[GW_OUT_N] = {"ok", "client_error", "server_error",
						    "cancelled"};

/* Bytes libmicrohttpd asks a streamed response for at a time. */
#define GW_STREAM_BLOCK 16384

#define NB_TTFT 13
#define NB_ITL	12
static const double ttft_b[NB_TTFT] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
				       1,     2.5,  5,	   10,	 30,  60};
static const double itl_b[NB_ITL] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
				     0.1,   0.25,   0.5,   1,	 2.5,	5};
/* vLLM's buckets for the same histograms (vllm/v1/metrics/loggers.py), so that dashboards
 * built for vLLM read the vllm: families unchanged. */
#define NB_VTTFT 22
#define NB_VITL	 19
static const double vllm_ttft_b[NB_VTTFT] = {0.001, 0.005, 0.01, 0.02,	0.04,  0.06,  0.08, 0.1,
					     0.25,  0.5,   0.75, 1.0,	2.5,   5.0,   7.5,  10.0,
					     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double vllm_itl_b[NB_VITL] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
					   0.3,	 0.4,	0.5,  0.75,  1.0, 2.5,	5.0,
					   7.5,	 10.0,	20.0, 40.0,  80.0};

/* Names the API answers to (--model-id a,b,...): the first is the default. */
#define GW_MAX_MODELS 8

struct gw {
	struct gw_opts o;
	char *model_buf; /* the --model-id list, split in place into models[] */
	const char *models[GW_MAX_MODELS];
	int n_models;
	int64_t created; /* /v1/models' "created": when the gateway started */
	struct oai_limits lim;
	struct img_limits img; /* lim.img points here */
	struct gw_backend be;
	struct MHD_Daemon *d;
	struct gw_net *net;	  /* connection limits */
	char *tls_cert, *tls_key; /* PEM, NULL for plain HTTP; MHD reads them while it runs */
	uint16_t port;
	atomic_ullong next_id;
	/* /metrics: the families below, then the backend's (a collector). Updates take no lock,
	 * so a scrape may see one request's counters half added; each value is exact. */
	struct met_reg *reg;
	struct met_counter *req[GW_OUT_N]; /* kvfs_requests_total{outcome} */
	struct met_counter *prompt_tokens, *cached_tokens, *gen_tokens, *cache_queries, *cache_hits;
	struct met_counter *unauthorized; /* 401s: a /v1 request without a valid key */
	struct met_gauge *running;	  /* jobs in flight */
	struct met_hist *ttft, *itl;
	/* The same quantities under vLLM's names and buckets (docs/serving.md, "Metrics"). */
	struct met_counter *v_prompt, *v_gen, *v_queries, *v_hits;
	struct met_hist *v_ttft, *v_itl;
	pthread_mutex_t mu; /* protects everything below */
	int live; /* jobs not yet freed: gw_stop waits for 0, a backend may hold the last ref */
	pthread_cond_t idle;
};

struct gw_job {
	pthread_mutex_t mu; /* protects every field below but efd */
	/* news for the connection thread (tokens, prompt, end): an eventfd it polls together with
	 * its client's socket, so it wakes at once for either. Set at creation, closed at free. */
	int efd;
	int refs;
	struct gw *g;
	uint64_t id;
	char idstr[48];
	const char *model; /* the name the request asked for (one of g->models) */
	int64_t created;
	struct oai_request req;
	char *prompt;
	char *raw; /* all generated text */
	size_t rawlen, rawcap;
	size_t visible; /* bytes of raw that are final (not a possible stop-string prefix) */
	size_t emitted; /* bytes streamed so far */
	int ntokens, prompt_tokens, cached_tokens;
	int done, stopped, cancelled;
	int role_sent, final_sent; /* streaming: its first and its last chunk are queued */
	int prompted;		   /* gw_job_prompt has run: the prompt was taken */
	int err;
	char errmsg[256];
	char finish[16];
	int64_t t0, t_first, t_last;
	void *bdata;
	int index;	     /* the choice's index in the response */
	int first_of_prompt; /* the first choice of its prompt (counts its prompt tokens) */
	const int32_t *toks; /* a prompt of token ids (in req), or NULL */
	/* chat: the images of req's messages in order, and where each goes in prompt */
	const struct img_image **images;
	size_t *image_off;
	int n_images;
	int n_toks;
	/* req.logprobs: one record per generated token, its text starting at raw + off */
	struct lp_rec {
		size_t off;
		char *token;
		float logprob;
		int n_top;
		char *top_token[OAI_MAX_TOP_LOGPROBS];
		float top_logprob[OAI_MAX_TOP_LOGPROBS];
	} * lps;
	int n_lps, cap_lps;
	int lp_emitted; /* records already streamed */
	size_t lp_next; /* in raw, where the next token's bytes start (gw_job_logprob) */
};

static void lp_rec_free(struct lp_rec *r)
{
	free(r->token);
	for (int k = 0; k < r->n_top; k++)
		free(r->top_token[k]);
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Wakes j's connection thread (wait_news). Any thread, with or without j->mu. */
static void job_wake(struct gw_job *j)
{
	uint64_t one = 1;
	/* cannot fail but at a counter of 2^64 - 2, which a read resets long before */
	(void)!write(j->efd, &one, sizeof(one));
}

static void job_unref(struct gw_job *j)
{
	pthread_mutex_lock(&j->mu);
	int last = --j->refs == 0;
	pthread_mutex_unlock(&j->mu);
	if (!last)
		return;
	struct gw *g = j->g;
	if (g->be.release)
		g->be.release(g->be.ctx, j);
	oai_request_free(&j->req);
	free(j->prompt);
	free(j->images);
	free(j->image_off);
	free(j->raw);
	for (int i = 0; i < j->n_lps; i++)
		lp_rec_free(&j->lps[i]);
	free(j->lps);
	pthread_mutex_destroy(&j->mu);
	close(j->efd);
	free(j);
	/* Last: once live is 0, gw_stop may free g. */
	pthread_mutex_lock(&g->mu);
	if (--g->live == 0)
		pthread_cond_broadcast(&g->idle);
	pthread_mutex_unlock(&g->mu);
}

void gw_job_set_backend_data(struct gw_job *j, void *data)
{
	j->bdata = data;
}
void *gw_job_backend_data(const struct gw_job *j)
{
	return j->bdata;
}
uint64_t gw_job_id(const struct gw_job *j)
{
	return j->id;
}

void gw_job_prompt(struct gw_job *j, int prompt_tokens, int cached_tokens)
{
	pthread_mutex_lock(&j->mu);
	j->prompt_tokens = prompt_tokens;
	j->cached_tokens = cached_tokens;
	j->prompted = 1;
	job_wake(j);
	pthread_mutex_unlock(&j->mu);
}

/* Longest suffix of raw that is a proper prefix of some stop string: text that must be held
 * back because the next token could complete a stop string. Called with j->mu held. */
static size_t holdback(const struct gw_job *j)
{
	size_t best = 0;
	for (int i = 0; i < j->req.n_stop; i++) {
		const char *s = j->req.stop[i];
		size_t sl = strlen(s);
		for (size_t k = sl - 1; k > best; k--)
			if (k <= j->rawlen && memcmp(j->raw + j->rawlen - k, s, k) == 0) {
				best = k;
				break;
			}
	}
	return best;
}

void gw_job_logprob(struct gw_job *j, const struct gw_logprob *lp)
{
	pthread_mutex_lock(&j->mu);
	if (j->stopped || j->done || !j->req.logprobs)
		goto out;
	if (j->n_lps == j->cap_lps) {
		int cap = j->cap_lps ? 2 * j->cap_lps : 32;
		struct lp_rec *n = realloc(j->lps, (size_t)cap * sizeof(*n));
		if (!n)
			goto out;
		j->lps = n;
		j->cap_lps = cap;
	}
	struct lp_rec *r = &j->lps[j->n_lps];
	memset(r, 0, sizeof(*r));
	/* The token's bytes start after every earlier token's, which may not all be in raw yet:
	 * the scheduler holds back the start of a character cut between tokens, at most 3 bytes.
	 * Kept within that (a token text cut short, or holding a NUL, cannot drift it). */
	size_t at = j->lp_next;
	at = at < j->rawlen ? j->rawlen : at > j->rawlen + 3 ? j->rawlen + 3 : at;
	r->off = at;
	r->logprob = lp->logprob;
	r->token = strdup(lp->token ? lp->token : "");
	int ok = r->token != NULL;
	if (ok)
		j->lp_next = at + strlen(r->token);
	for (int k = 0; k < lp->n_top && k < OAI_MAX_TOP_LOGPROBS; k++, r->n_top++) {
		r->top_token[k] = strdup(lp->top_token[k] ? lp->top_token[k] : "");
		r->top_logprob[k] = lp->top_logprob[k];
		ok &= r->top_token[k] != NULL;
	}
	if (ok)
		j->n_lps++;
	else
		lp_rec_free(r);
out:
	pthread_mutex_unlock(&j->mu);
}

/* The records [from, n_lps) whose text starts before end, as the writer's entries (pointing
 * into j's records: valid until the job is freed), offsets from base. Returns the count (0 and
 * NULL when none or out of memory). Called with j->mu held. */
static int lp_entries(const struct gw_job *j, int from, size_t end, size_t base,
		      struct oai_lp_entry **out)
{
	int n = 0;
	while (from + n < j->n_lps && j->lps[from + n].off < end)
		n++;
	*out = n ? calloc((size_t)n, sizeof(**out)) : NULL;
	size_t *raw = n ? malloc(2 * ((size_t)n + 1) * sizeof(size_t)) : NULL;
	if (!*out || !raw) {
		free(*out);
		*out = NULL;
		free(raw);
		return 0;
	}
	/* raw offsets to offsets in the text as written (oai_text_offsets), from base's */
	size_t *at = raw + n + 1;
	raw[0] = base;
	for (int i = 0; i < n; i++)
		raw[i + 1] = j->lps[from + i].off < base ? base : j->lps[from + i].off;
	oai_text_offsets(j->raw, j->rawlen, raw, n + 1, at);
	for (int i = 0; i < n; i++) {
		const struct lp_rec *r = &j->lps[from + i];
		struct oai_lp_entry *e = &(*out)[i];
		e->token = r->token;
		e->logprob = r->logprob;
		e->text_offset = (int)(at[i + 1] - at[0]);
		e->n_top = r->n_top;
		for (int k = 0; k < r->n_top; k++) {
			e->top[k].token = r->top_token[k];
			e->top[k].logprob = r->top_logprob[k];
		}
	}
	free(raw);
	return n;
}

void gw_job_token(struct gw_job *j, const char *piece, size_t len)
{
	int cancel = 0;
	int64_t t = now_ns();
	pthread_mutex_lock(&j->mu);
	if (j->stopped || j->done) {
		pthread_mutex_unlock(&j->mu);
		return;
	}
	if (j->rawlen + len + 1 > j->rawcap) {
		size_t cap = j->rawcap ? j->rawcap * 2 : 256;
		while (cap < j->rawlen + len + 1)
			cap *= 2;
		char *r = realloc(j->raw, cap);
		if (!r) {
			pthread_mutex_unlock(&j->mu);
			return;
		}
		j->raw = r;
		j->rawcap = cap;
	}
	size_t scan_from = j->visible;
	memcpy(j->raw + j->rawlen, piece, len);
	j->rawlen += len;
	j->raw[j->rawlen] = 0;
	j->ntokens++;
	struct gw *g = j->g;
	if (!j->t_first) {
		j->t_first = t;
		met_hist_observe_ns(g->ttft, (uint64_t)(t - j->t0));
		met_hist_observe_ns(g->v_ttft, (uint64_t)(t - j->t0));
	} else {
		met_hist_observe_ns(g->itl, (uint64_t)(t - j->t_last));
		met_hist_observe_ns(g->v_itl, (uint64_t)(t - j->t_last));
	}
	j->t_last = t;
	/* A stop string can only start in the not-yet-final tail. */
	size_t cut = (size_t)-1;
	for (int i = 0; i < j->req.n_stop; i++) {
		const char *hit = strstr(j->raw + scan_from, j->req.stop[i]);
		if (hit && (size_t)(hit - j->raw) < cut)
			cut = (size_t)(hit - j->raw);
	}
	if (cut != (size_t)-1) {
		j->rawlen = cut;
		j->raw[cut] = 0;
		j->visible = cut;
		j->stopped = 1;
		snprintf(j->finish, sizeof(j->finish), "stop");
		cancel = 1;
	} else {
		j->visible = j->rawlen - holdback(j);
	}
	job_wake(j);
	pthread_mutex_unlock(&j->mu);
	if (cancel && g->be.cancel)
		g->be.cancel(g->be.ctx, j);
}

void gw_job_finish(struct gw_job *j, const char *finish_reason, int err, const char *msg)
{
	pthread_mutex_lock(&j->mu);
	if (!j->done) {
		j->done = 1;
		if (!j->stopped) {
			j->err = err;
			if (err)
				snprintf(j->errmsg, sizeof(j->errmsg), "%s",
					 msg ? msg : strerror(-err));
			snprintf(j->finish, sizeof(j->finish), "%s",
				 finish_reason ? finish_reason : "stop");
			j->visible = j->rawlen;
		}
	}
	job_wake(j);
	pthread_mutex_unlock(&j->mu);
	job_unref(j);
}

/* ---- HTTP plumbing ---- */

struct conn {
	char *body;
	size_t len, cap;
	int too_big;
	char tenant[GW_TENANT_MAX + 1]; /* a /v1 request's, once its key was checked */
};

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype,
				 char *text)
{
	if (!text)
		return MHD_NO;
	struct MHD_Response *r =
	    MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", ctype);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_error(struct gw *g, struct MHD_Connection *c, unsigned status,
				  const char *msg, const char *type, const char *param,
				  const char *code)
{
	met_counter_add(g->req[status >= 500 ? GW_SERVER_ERR : GW_CLIENT_ERR], 1);
	return send_text(c, status, "application/json", oai_error_json(msg, type, param, code));
}

static void cancel_job(struct gw_job *j)
{
	pthread_mutex_lock(&j->mu);
	int already = j->cancelled || j->done;
	j->cancelled = 1;
	pthread_mutex_unlock(&j->mu);
	if (!already) {
		if (j->index == 0) /* a request is counted once */
			met_counter_add(j->g->req[GW_CANCELLED], 1);
		if (j->g->be.cancel)
			j->g->be.cancel(j->g->be.ctx, j);
	}
}

/* cancel_job unless j is over (done, or cut by a stop string): an answered request is
 * counted as what it was, not as cancelled. */
static void cancel_running(struct gw_job *j)
{
	pthread_mutex_lock(&j->mu);
	int over = j->done || j->stopped;
	pthread_mutex_unlock(&j->mu);
	if (!over)
		cancel_job(j);
}

/* Sleeps until there is news on j (job_wake) or the client of connection c hangs up (its
 * socket reads shut down: libmicrohttpd does not tell while the handler waits, so the socket
 * is polled for POLLRDHUP beside the job's eventfd; gw_stop shuts the sockets down, which
 * wakes this too). Returns 1 when the client is gone, after which the caller re-checks
 * its condition first. Called and returns with j->mu held; no timeout. */
static int wait_news(struct gw_job *j, struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	struct pollfd p[2] = {{.fd = j->efd, .events = POLLIN},
			      {.fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP}};
	pthread_mutex_unlock(&j->mu);
	int n = poll(p, 2, -1); /* -1 (EINTR): the caller re-checks and waits again */
	if (n > 0 && (p[0].revents & POLLIN)) {
		uint64_t v;
		(void)!read(j->efd, &v, sizeof(v)); /* nonblocking: resets the counter */
	}
	pthread_mutex_lock(&j->mu);
	return n > 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* The HTTP status, error type and code of a job that ended with err: what a worker refuses
 * because of the request itself is the client's error, as when the gateway refuses it. */
static unsigned job_status(int err, const char **type, const char **code)
{
	*type = "invalid_request_error";
	*code = NULL;
	switch (err) {
	case -E2BIG:
		*code = "context_length_exceeded";
		return 400;
	case -EINVAL:
	case -ERANGE:
		return 400;
	case -EAGAIN:
		*type = "server_error";
		*code = "overloaded";
		return 503;
	}
	*type = "server_error";
	*code = "generation_failed";
	return 500;
}

/* Counts j's outcome once: a job the client cancelled was counted by cancel_job. */
static void account(struct gw_job *j)
{
	struct gw *g = j->g;
	const char *type, *code;
	pthread_mutex_lock(&j->mu);
	int cancelled = j->cancelled, err = j->stopped ? 0 : j->err;
	pthread_mutex_unlock(&j->mu);
	if (cancelled || j->index > 0) /* a request is counted once, by its first choice */
		;
	else if (err && job_status(err, &type, &code) < 500)
		met_counter_add(g->req[GW_CLIENT_ERR], 1);
	else if (err)
		met_counter_add(g->req[GW_SERVER_ERR], 1);
	else
		met_counter_add(g->req[GW_OK], 1);
	/* the choices of one prompt share its tokens: counted once */
	uint64_t pt = j->first_of_prompt ? (uint64_t)j->prompt_tokens : 0;
	uint64_t ct = j->first_of_prompt ? (uint64_t)j->cached_tokens : 0;
	met_counter_add(g->prompt_tokens, pt);
	met_counter_add(g->cached_tokens, ct);
	met_counter_add(g->gen_tokens, (uint64_t)j->ntokens);
	met_counter_add(g->cache_queries, pt);
	met_counter_add(g->cache_hits, ct);
	met_counter_add(g->v_prompt, pt);
	met_counter_add(g->v_gen, (uint64_t)j->ntokens);
	met_counter_add(g->v_queries, pt);
	met_counter_add(g->v_hits, ct);
	/* Last: a scrape that sees the request gone sees its counts (atomic read-modify-writes
	 * are ordered on the platforms we build for; tests wait on this gauge). */
	met_gauge_add(g->running, -1);
}

/* Cancels what is still running of js[0..n), counts and drops the connection's references. */
static void drop_all(struct gw_job **js, int n)
{
	for (int i = 0; i < n; i++) {
		cancel_running(js[i]);
		account(js[i]);
		job_unref(js[i]);
	}
}

/* Streaming: the SSE bytes not yet handed to MHD, for the jobs of one request (its choices,
 * interleaved as their tokens come, each chunk naming its choice's index). */
struct stream {
	struct gw_job *js[OAI_MAX_CHOICES];
	int n;
	struct MHD_Connection *c;
	char *out;
	size_t len, off;
	int finished; /* [DONE] queued */
};

/* Appends one event and frees json. */
static void stream_put(struct stream *s, char *json)
{
	if (!json)
		return;
	size_t n = strlen(json), need = s->len + n + 8;
	char *o = realloc(s->out, need);
	if (!o) {
		free(json);
		return;
	}
	s->out = o;
	memcpy(s->out + s->len, "data: ", 6);
	memcpy(s->out + s->len + 6, json, n);
	memcpy(s->out + s->len + 6 + n, "\n\n", 2);
	s->len += n + 8;
	free(json);
}

/* Queues what job j has new: its first chunk (chat's role, or the echoed prompt), text, or
 * its final chunk (finish_reason, or an error event: *err set). 1 when something was
 * queued. */
static int stream_job(struct stream *s, struct gw_job *j, int *err)
{
	const struct oai_request *q = &j->req;
	if (!j->role_sent) {
		j->role_sent = 1;
		if (q->chat)
			stream_put(s,
				   oai_chunk_role_json(j->idstr, j->model, j->created, j->index));
		else if (q->echo) {
			struct oai_choice ch = {.index = j->index, .text = q->prompt};
			stream_put(
			    s, oai_chunk_choice_json(0, j->idstr, j->model, j->created, &ch, NULL));
		}
		return q->chat || q->echo;
	}
	pthread_mutex_lock(&j->mu);
	if (j->emitted < j->visible) {
		struct oai_choice ch = {.index = j->index, .has_lp = q->logprobs};
		ch.text = strndup(j->raw + j->emitted, j->visible - j->emitted);
		/* a token whose text is still held back is reported with that text */
		if (ch.has_lp) {
			ch.n_lp = lp_entries(j, j->lp_emitted, j->visible, j->emitted,
					     (struct oai_lp_entry **)&ch.lp);
			j->lp_emitted += ch.n_lp;
		}
		j->emitted = j->visible;
		pthread_mutex_unlock(&j->mu);
		if (ch.text)
			stream_put(s, oai_chunk_choice_json(q->chat, j->idstr, j->model, j->created,
							    &ch, NULL));
		free((char *)ch.text);
		free((void *)ch.lp);
		return 1;
	}
	if (!(j->done || j->stopped) || j->final_sent) {
		pthread_mutex_unlock(&j->mu);
		return 0;
	}
	/* done (or stopped) and everything emitted: its final chunk */
	j->final_sent = 1;
	int e = j->stopped ? 0 : j->err;
	char msg[256], fin[16];
	snprintf(msg, sizeof(msg), "%s", j->errmsg);
	snprintf(fin, sizeof(fin), "%s", j->finish);
	pthread_mutex_unlock(&j->mu);
	if (e) {
		const char *type, *code;
		job_status(e, &type, &code);
		stream_put(s, oai_error_json(msg, type, NULL, code));
		*err = e;
	} else {
		struct oai_choice ch = {
		    .index = j->index, .text = q->chat ? NULL : "", .finish_reason = fin};
		stream_put(
		    s, oai_chunk_choice_json(q->chat, j->idstr, j->model, j->created, &ch, NULL));
	}
	return 1;
}

/* The usage chunk (stream_options.include_usage) and [DONE]. */
static void stream_end(struct stream *s, int err)
{
	struct gw_job *j0 = s->js[0];
	if (!err && j0->req.include_usage) {
		struct oai_usage u = {0};
		for (int i = 0; i < s->n; i++) {
			struct gw_job *j = s->js[i];
			pthread_mutex_lock(&j->mu);
			u.prompt_tokens += j->first_of_prompt ? j->prompt_tokens : 0;
			u.cached_tokens += j->first_of_prompt ? j->cached_tokens : 0;
			u.completion_tokens += j->ntokens;
			pthread_mutex_unlock(&j->mu);
		}
		stream_put(s, oai_chunk_choice_json(j0->req.chat, j0->idstr, j0->model, j0->created,
						    NULL, &u));
	}
	char *o = realloc(s->out, s->len + 16);
	if (o) {
		s->out = o;
		memcpy(s->out + s->len, "data: [DONE]\n\n", 14);
		s->len += 14;
	}
	s->finished = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct stream *s = cls;
	for (;;) {
		if (s->off < s->len) {
			size_t n = s->len - s->off < max ? s->len - s->off : max;
			memcpy(buf, s->out + s->off, n);
			s->off += n;
			return (ssize_t)n;
		}
		if (s->finished)
			return MHD_CONTENT_READER_END_OF_STREAM;
		s->off = s->len = 0;
		int queued = 0, err = 0, waiting = -1;
		for (int i = 0; i < s->n && !err; i++) {
			queued |= stream_job(s, s->js[i], &err);
			if (waiting < 0 && !s->js[i]->final_sent)
				waiting = i;
		}
		if (err) { /* one choice failed: the others end with it */
			for (int i = 0; i < s->n; i++)
				cancel_running(s->js[i]);
			stream_end(s, err);
			continue;
		}
		if (waiting < 0) {
			stream_end(s, 0);
			continue;
		}
		if (queued)
			continue;
		/* nothing new: wait for the first unfinished choice (the choices of a forked
		 * prompt decode in the same steps), watching for a client that hangs up */
		struct gw_job *j = s->js[waiting];
		pthread_mutex_lock(&j->mu);
		int gone = 0;
		if (j->emitted == j->visible && !j->done && !j->stopped)
			gone = wait_news(j, s->c);
		int idle = j->emitted == j->visible && !j->done && !j->stopped;
		pthread_mutex_unlock(&j->mu);
		if (idle && gone) {
			for (int i = 0; i < s->n; i++)
				cancel_running(s->js[i]);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
}

static void stream_free(void *cls)
{
	struct stream *s = cls;
	drop_all(s->js, s->n);
	free(s->out);
	free(s);
}

/* Replaces the client's cache_salt / user by the tenant's salt (gw_auth.h): a client narrows
 * its cache within its tenant and can never name another's. */
static int tenant_salt(struct gw *g, const struct conn *cc, struct oai_request *r)
{
	if (!g->o.auth)
		return 0;
	char buf[GW_SALT_HEX];
	const char *salt;
	int rc = gw_auth_salt(g->o.auth, cc->tenant, r->salt, buf, &salt);
	if (rc)
		return rc;
	if (salt == r->salt)
		return 0;
	char *s = strdup(salt);
	if (!s)
		return -ENOMEM;
	free(r->salt);
	r->salt = s;
	return 0;
}

/* The first call of a /v1 request: 0 when it may go on (cc->tenant set), else the 401 is
 * queued (the body is never read) and its MHD result is in *ret. */
static int authorize(struct gw *g, struct MHD_Connection *c, struct conn *cc, enum MHD_Result *ret)
{
	if (!g->o.auth)
		return 0;
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	if (gw_auth_check(g->o.auth, h, cc->tenant) == 0)
		return 0;
	met_counter_add(g->unauthorized, 1);
	met_counter_add(g->req[GW_CLIENT_ERR], 1);
	char *body = oai_error_json(h ? "Incorrect API key provided."
				      : "You didn't provide an API key. Send it as "
					"'Authorization: Bearer YOUR_KEY'.",
				    "invalid_request_error", NULL, "invalid_api_key");
	struct MHD_Response *r =
	    body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE)
		 : NULL;
	if (!r) {
		free(body);
		*ret = MHD_NO;
		return -EACCES;
	}
	MHD_add_response_header(r, "Content-Type", "application/json");
	MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	*ret = MHD_queue_response(c, 401, r);
	MHD_destroy_response(r);
	return -EACCES;
}

/* The served name `name` equals, or NULL. A request without a model gets the first (the
 * default), which OpenAI would refuse: kept for curl users and scripts. */
static const char *model_find(const struct gw *g, const char *name)
{
	if (!name)
		return g->models[0];
	for (int i = 0; i < g->n_models; i++)
		if (strcmp(g->models[i], name) == 0)
			return g->models[i];
	return NULL;
}

static enum MHD_Result send_model_not_found(struct gw *g, struct MHD_Connection *c,
					    const char *name)
{
	char msg[384];
	snprintf(msg, sizeof(msg), "The model '%.300s' does not exist", name);
	return send_error(g, c, 404, msg, "invalid_request_error", "model", "model_not_found");
}

/* A response id unique across processes and restarts, as OpenAI's are: 96 random bits
 * ("chatcmpl-" + 24 hex digits). A counter restarted at 1 with every process, and clients
 * that key logs or caches on ids mixed answers up. */
static void job_make_id(struct gw_job *j, int chat)
{
	unsigned char r[12];
	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
		/* No entropy (never on Linux >= 3.17 after boot): time and counter still differ. */
		uint64_t t = (uint64_t)now_ns() ^ (j->id << 40);
		memcpy(r, &t, 8);
		memcpy(r + 8, &j->id, 4);
	}
	int n = snprintf(j->idstr, sizeof(j->idstr), "%s-", chat ? "chatcmpl" : "cmpl");
	for (size_t i = 0; i < sizeof(r); i++)
		n += snprintf(j->idstr + n, sizeof(j->idstr) - (size_t)n, "%02x", r[i]);
}

/* echo: the prompt, then the completion (malloc'd, or NULL). Called with j->mu held. */
static char *echo_text(const struct gw_job *j)
{
	size_t pl = strlen(j->req.prompt), rl = j->raw ? strlen(j->raw) : 0;
	char *t = malloc(pl + rl + 1);
	if (t) {
		memcpy(t, j->req.prompt, pl);
		if (rl)
			memcpy(t + pl, j->raw, rl);
		t[pl + rl] = 0;
	}
	return t;
}

/* The answer to a backend's submit failure (nothing started). */
static enum MHD_Result send_submit_error(struct gw *g, struct MHD_Connection *c, int rc)
{
	if (rc == -EAGAIN)
		return send_error(g, c, 503, "no replica can take the request now", "server_error",
				  NULL, "overloaded");
	if (rc == -ERANGE)
		return send_error(g, c, 400,
				  "'logit_bias' names a token id outside the model's vocabulary",
				  "invalid_request_error", "logit_bias", NULL);
	return send_error(g, c, 400,
			  rc == -E2BIG ? "prompt is longer than the model's context"
				       : "the request cannot be served (a token id outside the "
					 "vocabulary, or an empty prompt)",
			  "invalid_request_error", "prompt",
			  rc == -E2BIG ? "context_length_exceeded" : NULL);
}

/* Makes j (its request parsed) choice `index` of its request: ids (first's, when given: one
 * response id for every choice), its prompt (choice index / n's; chat: the rendered
 * messages) and, for the k-th choice of a prompt with a seed, seed + k * golden ratio, so that
 * choices differ and each is repeatable. Takes g->live and sets refs 2. 0, -ENOMEM, or
 * -EMFILE (no descriptor for the job's eventfd: j is left untouched, free it as parsed). */
static int job_init(struct gw *g, struct gw_job *j, int chat, int index, const char *model,
		    const struct gw_job *first)
{
	if ((j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
		return -EMFILE;
	pthread_mutex_init(&j->mu, NULL);
	j->refs = 2; /* the connection's and the backend's */
	j->g = g;
	pthread_mutex_lock(&g->mu);
	g->live++;
	pthread_mutex_unlock(&g->mu);
	j->id = atomic_fetch_add(&g->next_id, 1);
	j->index = index;
	j->model = model;
	if (first) {
		memcpy(j->idstr, first->idstr, sizeof(j->idstr));
		j->created = first->created;
	} else {
		job_make_id(j, chat);
		j->created = (int64_t)time(NULL);
	}
	j->t0 = now_ns();
	int k = index % j->req.n, p = index / j->req.n;
	j->first_of_prompt = k == 0;
	if (k && j->req.has_seed)
		j->req.seed += (uint64_t)k * 0x9E3779B97F4A7C15ULL;
	if (chat) {
		int ni = oai_count_images(&j->req);
		if (ni > 0) {
			j->images = calloc((size_t)ni, sizeof(*j->images));
			j->image_off = calloc((size_t)ni, sizeof(*j->image_off));
			if (!j->images || !j->image_off)
				return -ENOMEM;
			for (int i = 0, k = 0; i < j->req.n_messages; i++)
				for (int m = 0; m < j->req.messages[i].n_images; m++)
					j->images[k++] = &j->req.messages[i].images[m].img;
			j->n_images = ni;
		}
		return oai_render_chat_media(&j->req, g->o.chat_template, &j->prompt, j->image_off,
					     ni);
	}
	j->req.prompt = j->req.prompts[p].text;
	j->toks = j->req.prompts[p].toks;
	j->n_toks = j->req.prompts[p].n_toks;
	j->prompt = strdup(j->req.prompt ? j->req.prompt : "");
	return j->prompt ? 0 : -ENOMEM;
}

/* Submits js[0..n); on a failure cancels those already submitted and drops them. 0 or the
 * backend's error. */
static int submit_all(struct gw *g, struct gw_job **js, int n)
{
	for (int i = 0; i < n; i++) {
		struct gw_job *j = js[i];
		int k = j->index % j->req.n;
		struct gw_req req = {.id = j->id,
				     .oai = &j->req,
				     .prompt = j->prompt,
				     .toks = j->toks,
				     .n_toks = j->n_toks,
				     .index = j->index,
				     .n_forks = k == 0 ? j->req.n - 1 : 0,
				     .first = k ? js[i - k] : NULL,
				     .images = j->images,
				     .image_off = j->image_off,
				     .n_images = j->n_images};
		met_gauge_add(g->running, 1);
		int rc = g->be.submit(g->be.ctx, j, &req);
		if (!rc)
			continue;
		met_gauge_add(g->running, -1);
		j->refs = 1;
		job_unref(j);
		js[i] = NULL;
		for (int k = i + 1; k < n; k++) {
			js[k]->refs = 1;
			job_unref(js[k]);
			js[k] = NULL;
		}
		for (int k = 0; k < i; k++) {
			cancel_job(js[k]);
			account(js[k]);
			job_unref(js[k]);
			js[k] = NULL;
		}
		return rc;
	}
	return 0;
}

/* Several choices, answered whole: waits for every job (cancelling all when the client
 * leaves), then one response with every choice, or the first failure's error. Drops the
 * connection's references. */
static enum MHD_Result answer_many(struct MHD_Connection *c, int chat, struct gw_job **js, int n)
{
	for (int i = 0; i < n; i++) {
		struct gw_job *j = js[i];
		pthread_mutex_lock(&j->mu);
		while (!j->done && !j->stopped) {
			if (wait_news(j, c) && !j->done && !j->stopped) {
				pthread_mutex_unlock(&j->mu);
				drop_all(js, n);
				return MHD_NO;
			}
		}
		pthread_mutex_unlock(&j->mu);
	}
	struct oai_choice ch[OAI_MAX_CHOICES] = {0};
	char *echoed[OAI_MAX_CHOICES] = {0};
	struct oai_usage u = {0};
	int err = 0;
	char msg[256] = "";
	for (int i = 0; i < n; i++) {
		struct gw_job *j = js[i];
		pthread_mutex_lock(&j->mu);
		int e = j->stopped ? 0 : j->err;
		if (e && !err) {
			err = e;
			snprintf(msg, sizeof(msg), "%s", j->errmsg);
		}
		if (j->first_of_prompt) { /* the choices of one prompt share its tokens */
			u.prompt_tokens += j->prompt_tokens;
			u.cached_tokens += j->cached_tokens;
		}
		u.completion_tokens += j->ntokens;
		echoed[i] = !chat && j->req.echo ? echo_text(j) : NULL;
		ch[i] = (struct oai_choice){.index = j->index,
					    .text = echoed[i] ? echoed[i] : j->raw,
					    .finish_reason = j->finish,
					    .has_lp = j->req.logprobs};
		if (ch[i].has_lp)
			ch[i].n_lp =
			    lp_entries(j, 0, j->rawlen, 0, (struct oai_lp_entry **)&ch[i].lp);
		pthread_mutex_unlock(&j->mu);
	}
	/* the jobs are done: their texts no longer change */
	char *body = err ? NULL
			 : oai_response_choices_json(chat, js[0]->idstr, js[0]->model,
						     js[0]->created, ch, n, &u);
	for (int i = 0; i < n; i++) {
		free((void *)ch[i].lp);
		free(echoed[i]);
		account(js[i]);
		job_unref(js[i]);
	}
	if (!err)
		return send_text(c, 200, "application/json", body);
	const char *type, *code;
	unsigned st = job_status(err, &type, &code);
	return send_text(c, st, "application/json",
			 oai_error_json(msg, type,
					st >= 500	 ? NULL
					: err == -ERANGE ? "logit_bias"
							 : "prompt",
					code));
}

static enum MHD_Result generate(struct gw *g, struct MHD_Connection *c, int chat, struct conn *cc)
{
	char err[256];
	const char *param = NULL;
	struct gw_job *js[OAI_MAX_CHOICES] = {0}, *j = calloc(1, sizeof(*j));
	if (!j)
		return send_error(g, c, 500, "out of memory", "server_error", NULL, NULL);
	int rc =
	    oai_parse_request(cc->body, cc->len, chat, &g->lim, &j->req, err, sizeof(err), &param);
	if (rc) {
		free(j);
		return send_error(g, c, 400, err, "invalid_request_error", param,
				  rc == -E2BIG ? "context_length_exceeded" : NULL);
	}
	if (!g->o.vision && oai_count_images(&j->req) > 0) {
		oai_request_free(&j->req);
		free(j);
		return send_error(g, c, 400, "model has no vision encoder (start with --mmproj)",
				  "invalid_request_error", "messages", "model_not_multimodal");
	}
	const char *model = model_find(g, j->req.model);
	if (!model) {
		enum MHD_Result ret = send_model_not_found(g, c, j->req.model);
		oai_request_free(&j->req);
		free(j);
		return ret;
	}
	/* one job a choice, each with its own copy of the request (parsed again: it parsed) */
	int n = j->req.n * (chat ? 1 : j->req.n_prompts);
	js[0] = j;
	for (int i = 1; i < n && rc == 0; i++)
		if (!(js[i] = calloc(1, sizeof(*js[i]))) ||
		    oai_parse_request(cc->body, cc->len, chat, &g->lim, &js[i]->req, NULL, 0, NULL))
			rc = -ENOMEM;
	/* every copy's salt becomes its tenant's: a client narrows within its tenant only */
	for (int i = 0; i < n && rc == 0; i++)
		rc = tenant_salt(g, cc, &js[i]->req);
	for (int i = 0; i < n && rc == 0; i++)
		rc = job_init(g, js[i], chat, i, model, i ? js[0] : NULL);
	if (rc) {
		for (int i = 0; i < n; i++) {
			if (js[i] && js[i]->g) {
				js[i]->refs = 1;
				job_unref(js[i]);
			} else if (js[i]) {
				oai_request_free(&js[i]->req);
				free(js[i]);
			}
		}
		if (rc == -EMFILE)
			return send_error(g, c, 503, "out of file descriptors", "server_error",
					  NULL, "overloaded");
		return send_error(g, c, 500, "cannot prepare the request", "server_error", NULL,
				  NULL);
	}
	if ((rc = submit_all(g, js, n)))
		return send_submit_error(g, c, rc);
	if (n > 1 && !j->req.stream)
		return answer_many(c, chat, js, n);

	/* Wait for the end (not streaming), or until the prompt was taken (streaming: a
	 * request a worker refuses gets its error status instead of a 200 and an error
	 * event), watching for a client that hangs up. */
	pthread_mutex_lock(&j->mu);
	while (!j->done && !j->stopped && (!j->req.stream || !j->prompted)) {
		if (wait_news(j, c) && !j->done && !j->stopped &&
		    (!j->req.stream || !j->prompted)) {
			pthread_mutex_unlock(&j->mu);
			drop_all(js, n);
			return MHD_NO;
		}
	}
	int jerr = j->stopped ? 0 : j->err;
	char msg[256];
	snprintf(msg, sizeof(msg), "%s", j->errmsg);
	if (jerr && (!j->req.stream || j->ntokens == 0)) {
		pthread_mutex_unlock(&j->mu);
		drop_all(js, n);
		const char *type, *code;
		unsigned st = job_status(jerr, &type, &code);
		return send_text(c, st, "application/json",
				 oai_error_json(msg, type,
						st >= 500	  ? NULL
						: jerr == -ERANGE ? "logit_bias"
								  : "prompt",
						code));
	}
	if (j->req.stream) {
		pthread_mutex_unlock(&j->mu);
		struct stream *s = calloc(1, sizeof(*s));
		if (!s) {
			drop_all(js, n);
			return MHD_NO;
		}
		memcpy(s->js, js, (size_t)n * sizeof(*js));
		s->n = n;
		s->c = c;
		struct MHD_Response *r = MHD_create_response_from_callback(
		    MHD_SIZE_UNKNOWN, GW_STREAM_BLOCK, stream_read, s, stream_free);
		if (!r) {
			stream_free(s);
			return MHD_NO;
		}
		MHD_add_response_header(r, "Content-Type", "text/event-stream");
		MHD_add_response_header(r, "Cache-Control", "no-cache");
		enum MHD_Result ret = MHD_queue_response(c, 200, r);
		MHD_destroy_response(r);
		return ret;
	}

	struct oai_usage u = {j->prompt_tokens, j->ntokens, j->cached_tokens};
	char *echoed = !chat && j->req.echo ? echo_text(j) : NULL;
	struct oai_choice ch = {.text = echoed ? echoed : j->raw,
				.finish_reason = j->finish,
				.has_lp = j->req.logprobs};
	if (ch.has_lp)
		ch.n_lp = lp_entries(j, 0, j->rawlen, 0, (struct oai_lp_entry **)&ch.lp);
	char *body = oai_response_choices_json(chat, j->idstr, j->model, j->created, &ch, 1, &u);
	free((void *)ch.lp);
	free(echoed);
	pthread_mutex_unlock(&j->mu);
	account(j);
	job_unref(j);
	return send_text(c, 200, "application/json", body);
}

/* The exposition text (malloc'd), or NULL when it cannot be written. */
static char *metrics_text(struct gw *g, enum met_page page)
{
	char *text = NULL;
	size_t len;
	int rc = met_render_page(g->reg, page, &text, &len);
	if (rc) {
		klog_error("/metrics: %s", strerror(-rc));
		return NULL;
	}
	return text;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
			       const char *method, const char *version, const char *upload,
			       size_t *upload_size, void **con_cls)
{
	(void)version;
	struct gw *g = cls;
	struct conn *cc = *con_cls;
	if (!cc) {
		cc = calloc(1, sizeof(*cc));
		if (!cc)
			return MHD_NO;
		*con_cls = cc;
		enum MHD_Result ret;
		if (strncmp(url, "/v1/", 4) == 0 && authorize(g, c, cc, &ret))
			return ret;
		return MHD_YES;
	}
	if (*upload_size) {
		if (!cc->too_big && cc->len + *upload_size > g->o.max_body) {
			cc->too_big = 1;
		} else if (!cc->too_big) {
			if (cc->len + *upload_size + 1 > cc->cap) {
				size_t cap = cc->cap ? cc->cap : 4096;
				while (cap < cc->len + *upload_size + 1)
					cap *= 2;
				char *b = realloc(cc->body, cap);
				if (!b)
					return MHD_NO;
				cc->body = b;
				cc->cap = cap;
			}
			memcpy(cc->body + cc->len, upload, *upload_size);
			cc->len += *upload_size;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
	if (cc->too_big)
		return send_error(g, c, 400, "request body is larger than this server accepts",
				  "invalid_request_error", NULL, "request_too_large");
	if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0) {
		if (!post)
			return send_error(g, c, 405, "use POST", "invalid_request_error", NULL,
					  NULL);
		return generate(g, c, url[4] == 'c' && url[5] == 'h', cc);
	}
	if (strcmp(url, "/v1/models") == 0 && get)
		return send_text(c, 200, "application/json",
				 oai_models_json(g->models, g->n_models, g->created));
	if (strncmp(url, "/v1/models/", 11) == 0 && get) {
		const char *m = model_find(g, url + 11);
		if (!m)
			return send_model_not_found(g, c, url + 11);
		return send_text(c, 200, "application/json", oai_model_json(m, g->created));
	}
	if (strcmp(url, "/health") == 0 && get) {
		int ok = !g->be.healthy || g->be.healthy(g->be.ctx);
		return send_text(
		    c, ok ? 200 : 503, "application/json",
		    strdup(ok ? "{\"status\":\"ok\"}" : "{\"status\":\"unavailable\"}"));
	}
	if (strcmp(url, "/metrics") == 0 && get)
		return send_text(c, 200, "text/plain; version=0.0.4",
				 metrics_text(g, MET_PAGE_PLAIN));
	if (strcmp(url, "/metrics/vllm") == 0 && get)
		return send_text(c, 200, "text/plain; version=0.0.4", metrics_text(g, MET_PAGE_NS));
	return send_error(g, c, 404, "no such endpoint", "invalid_request_error", NULL, NULL);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	(void)cls, (void)c, (void)toe;
	struct conn *cc = *con_cls;
	if (cc) {
		free(cc->body);
		free(cc);
		*con_cls = NULL;
	}
}

/* vLLM's families for what the gateway measures, with vLLM's meaning: tokens of finished
 * requests (prompt, generated, prefix-cache queries and hits) and per-token latencies
 * measured from the request's arrival at the gateway. 0 or -ENOMEM. */
static int metrics_init_vllm(struct gw *g)
{
	struct met_reg *r = g->reg;
	g->v_prompt = met_counter_new(r, "vllm:prompt_tokens_total",
				      "Number of prefill tokens processed.", NULL);
	g->v_gen = met_counter_new(r, "vllm:generation_tokens_total",
				   "Number of generation tokens processed.", NULL);
	g->v_queries =
	    met_counter_new(r, "vllm:prefix_cache_queries_total",
			    "Prefix cache queries, in terms of number of queried tokens.", NULL);
	g->v_hits =
	    met_counter_new(r, "vllm:prefix_cache_hits_total",
			    "Prefix cache hits, in terms of number of cached tokens.", NULL);
	g->v_ttft = met_hist_new(r, "vllm:time_to_first_token_seconds",
				 "Histogram of time to first token in seconds.", NULL, vllm_ttft_b,
				 NB_VTTFT);
	g->v_itl =
	    met_hist_new(r, "vllm:inter_token_latency_seconds",
			 "Histogram of inter-token latency in seconds.", NULL, vllm_itl_b, NB_VITL);
	return g->v_prompt && g->v_gen && g->v_queries && g->v_hits && g->v_ttft && g->v_itl
		   ? 0
		   : -ENOMEM;
}

/* Registers the gateway's families, in the order /metrics shows them, and the backend's
 * collector. 0 or -ENOMEM (a bad name is a bug, caught by the tests). */
static int metrics_init(struct gw *g)
{
	int rc = met_reg_create(&g->reg);
	if (rc)
		return rc;
	struct met_reg *r = g->reg;
	int ok = 1;
	for (int i = 0; i < GW_OUT_N; i++) {
		const char *lab[] = {"outcome", outcome_names[i], NULL};
		g->req[i] = met_counter_new(
		    r, "kvfs_requests_total",
		    "HTTP requests answered, by outcome (cancelled: the client left first)", lab);
		ok &= g->req[i] != NULL;
	}
	g->unauthorized =
	    met_counter_new(r, "kvfs_gateway_unauthorized_total",
			    "/v1 requests refused (401) for a missing or unknown API key", NULL);
	g->running = met_gauge_new(r, "kvfs_requests_running",
				   "Completion requests the backend is working on", NULL);
	g->prompt_tokens =
	    met_counter_new(r, "prompt_tokens_total", "Prompt tokens of finished requests", NULL);
	g->gen_tokens = met_counter_new(r, "generation_tokens_total",
					"Tokens generated for finished requests", NULL);
	g->cached_tokens = met_counter_new(r, "cached_tokens_total",
					   "Prompt tokens whose KV came from the cache", NULL);
	g->cache_queries = met_counter_new(r, "prefix_cache_queries_total",
					   "Prompt tokens looked up in the prefix cache", NULL);
	g->cache_hits = met_counter_new(r, "prefix_cache_hits_total",
					"Prompt tokens found in the prefix cache", NULL);
	g->ttft =
	    met_hist_new(r, "time_to_first_token_seconds",
			 "Time from a request's arrival to its first token", NULL, ttft_b, NB_TTFT);
	g->itl = met_hist_new(r, "inter_token_latency_seconds",
			      "Time between two tokens of one request", NULL, itl_b, NB_ITL);
	ok &= g->running && g->unauthorized && g->prompt_tokens && g->gen_tokens &&
	      g->cached_tokens && g->cache_queries && g->cache_hits && g->ttft && g->itl;
	ok &= metrics_init_vllm(g) == 0;
	if (ok && g->be.metrics_register)
		ok = g->be.metrics_register(g->be.ctx, r) == 0;
	if (ok && g->be.metrics)
		ok = met_collector_add(r, g->be.metrics, g->be.ctx) == 0;
	if (!ok) {
		met_reg_destroy(g->reg);
		g->reg = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* Frees what gw_start made before the daemon (metrics, limits, TLS files) and g. */
static void gw_free(struct gw *g)
{
	gw_net_destroy(g->net);
	free(g->model_buf);
	free(g->tls_cert);
	free(g->tls_key);
	met_reg_destroy(g->reg);
	free(g);
}

/* The connection limits and the TLS files. 0 or a negative errno (logged). */
static int listen_prepare(struct gw *g, const struct gw_opts *o)
{
	int rc = gw_net_create(o->max_conns ? o->max_conns : 512,
			       o->max_conns_per_address ? o->max_conns_per_address : 64, g->reg,
			       &g->net);
	if (rc)
		return rc;
	if (!o->tls_cert != !o->tls_key) {
		klog_error("HTTPS needs both a certificate and its key");
		return -EINVAL;
	}
	if (o->tls_cert)
		rc = gw_net_tls_load(o->tls_cert, o->tls_key, &g->tls_cert, &g->tls_key);
	return rc;
}

/* Splits --model-id's comma-separated names into g->models. -EINVAL: an empty name or more
 * than GW_MAX_MODELS; -ENOMEM. */
static int models_init(struct gw *g)
{
	g->created = (int64_t)time(NULL);
	if (!(g->model_buf = strdup(g->o.model_id ? g->o.model_id : "kvfs")))
		return -ENOMEM;
	char *save = NULL;
	for (char *t = strtok_r(g->model_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (g->n_models == GW_MAX_MODELS)
			goto bad;
		g->models[g->n_models++] = t;
	}
	if (g->n_models == 0)
		goto bad;
	g->o.model_id = g->models[0];
	return 0;
bad:
	free(g->model_buf);
	return -EINVAL;
}

int gw_start(const struct gw_opts *o, const struct gw_backend *be, struct gw **out)
{
	if (!be || !be->submit)
		return -EINVAL;
	struct gw *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->o = *o;
	if (!g->o.max_body)
		g->o.max_body = 1 << 20;
	if (models_init(g)) {
		free(g);
		return -EINVAL;
	}
	g->lim = o->limits;
	if (!g->lim.max_prompt_bytes)
		g->lim.max_prompt_bytes = 64 << 10;
	if (!g->lim.max_tokens)
		g->lim.max_tokens = 4096;
	if (!g->lim.default_max_tokens)
		g->lim.default_max_tokens = 16;
	if (!g->lim.max_messages)
		g->lim.max_messages = 64;
	if (!g->lim.max_images)
		g->lim.max_images = OAI_DEF_MAX_IMAGES;
	img_limits_resolve(o->limits.img, &g->img);
	g->lim.img = &g->img;
	g->be = *be;
	atomic_init(&g->next_id, 1);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o->port)};
	if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &sa.sin_addr) != 1) {
		free(g->model_buf);
		free(g);
		return -EINVAL;
	}
	if (metrics_init(g)) {
		free(g->model_buf);
		free(g);
		return -ENOMEM;
	}
	int rc = listen_prepare(g, o);
	if (rc) {
		gw_free(g);
		return rc;
	}
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->idle, NULL);
	/* A connection idle 30 s is closed: with 512 threads at most, idle sockets (a
	 * client that connected and sends nothing) held every slot for the old 600 s. A
	 * request being served is never idle to MHD: its thread is inside our handler or
	 * stream reader. */
	struct MHD_OptionItem opts[] = {
	    {MHD_OPTION_SOCK_ADDR, 0, &sa},
	    {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, g},
	    {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)gw_net_mhd_limit(g->net), NULL},
	    {MHD_OPTION_CONNECTION_TIMEOUT, GW_CONN_TIMEOUT_S, NULL},
	    {MHD_OPTION_END, 0, NULL},
	    {MHD_OPTION_END, 0, NULL},
	    {MHD_OPTION_END, 0, NULL},
	};
	/* poll(), not select(): past descriptor 1023 (a busy engine process, a flood of
	 * connections) select() cannot watch a socket and MHD refuses it. */
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
			 MHD_USE_POLL | MHD_USE_ERROR_LOG;
	if (g->tls_cert) {
		flags |= MHD_USE_TLS;
		opts[4] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, g->tls_cert};
		opts[5] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, g->tls_key};
	}
	g->d = MHD_start_daemon(flags, 0, gw_net_accept, g->net, handler, g,
				MHD_OPTION_NOTIFY_CONNECTION, gw_net_notify, g->net,
				MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
	if (!g->d) {
		klog_error("cannot listen on %s:%u%s", o->host ? o->host : "127.0.0.1", o->port,
			   g->tls_cert ? " with TLS (is the key the certificate's?)" : "");
		rc = g->tls_cert ? -EINVAL : -EADDRINUSE;
		pthread_cond_destroy(&g->idle);
		pthread_mutex_destroy(&g->mu);
		gw_free(g);
		return rc;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(g->d, MHD_DAEMON_INFO_BIND_PORT);
	g->port = di ? di->port : o->port;
	*out = g;
	return 0;
}

uint16_t gw_port(const struct gw *g)
{
	return g->port;
}

void gw_stop(struct gw *g)
{
	if (!g)
		return;
	MHD_stop_daemon(g->d);
	/* The connections are gone and their jobs cancelled; a backend may still hold a job
	 * (its last reference, dropped by gw_job_finish) and touch g when it frees it. */
	pthread_mutex_lock(&g->mu);
	while (g->live > 0)
		pthread_cond_wait(&g->idle, &g->mu);
	pthread_mutex_unlock(&g->mu);
	pthread_cond_destroy(&g->idle);
	pthread_mutex_destroy(&g->mu);
	gw_free(g);
}
