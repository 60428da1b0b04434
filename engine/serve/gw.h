/* gw — the HTTP gateway: OpenAI-compatible endpoints over libmicrohttpd, in front of a
 * backend that generates tokens (the embedded engine, or the prefill/decode load balancers
 * talking to worker processes).
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (stream: true as server-sent
 * events ending in `data: [DONE]`), GET /v1/models, GET /v1/models/{id}, GET /health,
 * GET /metrics (Prometheus). Response ids are random (96 bits), unique across restarts.
 * Every error is an OpenAI error JSON with its HTTP status; bodies past max_body, malformed
 * JSON and wrong types are 400s and the gateway keeps serving. A client that disconnects has
 * its request cancelled in the backend (which frees its KV).
 *
 * A request with several choices (n, a list of prompts) is one job per choice, each with its
 * own copy of the parsed request, answered together or streamed interleaved (each chunk names
 * its choice's index); the request is counted
 * once in kvfs_requests_total, each prompt's tokens once.
 *
 * Stop strings are applied here, on text: generation stops at the first stop string, which is
 * not returned; streamed text is held back while it could still be the start of one.
 *
 * Threading: one thread per HTTP connection (libmicrohttpd), at most GW_MAX_CONNECTIONS. Backends
 * deliver tokens from any thread through gw_job_*; a job is reference-counted between the
 * connection and the backend.
 *
 * What blocks: a connection thread waits for its job (the end, or a stream's next tokens) in
 * poll() on the job's eventfd and its client's socket, with no timeout: gw_job_* wake it at
 * once, and so does the client hanging up (the job is then cancelled in the backend). The
 * gw_job_* calls never block but on the job's mutex. gw_stop blocks until every connection
 * has ended and the backend has finished every job it took.
 */
#ifndef KVFS_GW_H
#define KVFS_GW_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "oai.h"

/* HTTP connections at once (libmicrohttpd's limit); more are refused by the server. */
#define GW_MAX_CONNECTIONS 512
/* An idle HTTP connection is closed after this long. */
#define GW_CONN_TIMEOUT_S 30

struct gw;
struct gw_auth;
struct gw_job;
struct met_out;
struct met_reg;

/* What the gateway hands a backend for one request. Valid until gw_job_finish. */
struct gw_req {
	uint64_t id;
	const struct oai_request *oai; /* sampling parameters, salt, max_tokens */
	const char *prompt;	       /* completions: the prompt; chat: the rendered template */
	/* A completions prompt given as token ids: the ids, and prompt is "". NULL for a text
	 * prompt. Every backend takes them (and oai->logprobs: gw_job_logprob). */
	const int32_t *toks;
	int n_toks;
	int index; /* the choice this job answers (n > 1, several prompts): 0.. */
	/* n > 1: the choices of one prompt. The first is submitted with n_forks = n - 1, then
	 * the others right after it, each with first = the first's job (submitted: its backend
	 * data is set). A backend may compute the prompt once and fork its KV for the others,
	 * holding the first until its followers were submitted; when one cannot be, the gateway
	 * cancels the first (and the followers submitted). A backend that does not fork serves
	 * each as a request of its own. */
	int n_forks;
	struct gw_job *first;
	/* chat: the request's images (in oai), each where image_off[i] bytes of prompt end */
	const struct img_image *const *images;
	const size_t *image_off;
	int n_images;
};

/* One generated token's log-probability and its most likely alternatives (texts valid during
 * the call). */
struct gw_logprob {
	const char *token;
	float logprob;
	int n_top;
	const char *top_token[OAI_MAX_TOP_LOGPROBS];
	float top_logprob[OAI_MAX_TOP_LOGPROBS];
};

struct gw_backend {
	void *ctx;
	/* Starts generating for job; returns 0, or -EAGAIN (no replica can take it: 503),
	 * -E2BIG / -EINVAL (prompt too long or bad: 400) with nothing started. After 0 the backend
	 * owns a reference: it reports tokens with gw_job_token and ends with exactly one
	 * gw_job_finish, from any thread. */
	int (*submit)(void *ctx, struct gw_job *job, const struct gw_req *req);
	/* The client is gone or a stop string matched: stop soon and gw_job_finish. May be
	 * called after the backend finished (then a no-op). */
	void (*cancel)(void *ctx, struct gw_job *job);
	/* The job is being freed (after gw_job_finish and the client's end): free what
	 * gw_job_set_backend_data pointed to. cancel is never called after this. Called for every
	 * job passed to submit, also when submit failed (data then NULL). May be NULL. */
	void (*release)(void *ctx, struct gw_job *job);
	/* Writes the backend's metric families (per-replica load, ...) after the gateway's own,
	 * with met_out_family / met_out_sample (common/metrics.h: a collector, run on the scraping
	 * thread under the registry's lock; it must not register metrics). May be NULL. */
	void (*metrics)(void *ctx, struct met_out *out);
	/* 1 when at least one replica can serve. May be NULL (always healthy). */
	int (*healthy)(void *ctx);
	/* Registers the backend's own metrics (histograms it observes itself) in the gateway's
	 * registry, once, in gw_start before any request; 0 or a negative errno (gw_start then
	 * fails with -ENOMEM). May be NULL. */
	int (*metrics_register)(void *ctx, struct met_reg *r);
};

struct gw_opts {
	const char *host; /* listen address; default 127.0.0.1 */
	uint16_t port;	  /* 0 = ephemeral */
	/* The names the API serves, comma-separated ("llama,gpt-3.5-turbo"): /v1/models lists
	 * them all, a request names one of them (its response echoes it) or none (the first);
	 * any other name is a 404 model_not_found. At most 8. Default "kvfs". */
	const char *model_id;
	const char *chat_template; /* "chatml", "llama3", "plain" (default) */
	size_t max_body;	   /* default 1 MiB */
	/* zeros = defaults (64 KiB prompt, 4096 tokens, 16, 64, 8 images); limits.img (NULL =
	 * img.h's defaults) is copied by gw_start */
	struct oai_limits limits;
	/* 1: the backend takes images (a vision encoder is loaded). 0: a request with an image is
	 * decoded and checked (a bad one is a 400 naming its problem), then refused with a 400
	 * "model has no vision encoder (start with --mmproj)". */
	int vision;
	/* API keys and tenant salts (gw_auth.h): every /v1 route needs a key the set knows (401
	 * otherwise) and a request's salt is derived from its tenant. NULL: no keys, the
	 * client's salt as sent (tests of the HTTP side only; the daemons always pass one). Not
	 * owned; must outlive the gateway. */
	struct gw_auth *auth;
	/* Connections (gw_net.h): at most max_conns in all (0 = 512) and max_conns_per_address
	 * from one source address (0 = 64); loopback has a small reserve past max_conns. */
	unsigned max_conns, max_conns_per_address;
	/* HTTPS: PEM files of the certificate chain and its key; both NULL = plain HTTP. */
	const char *tls_cert, *tls_key;
};

/* Starts listening. Returns 0, -EADDRINUSE, -EINVAL (bad host or model list, also a bad TLS
 * file), -ENOENT / -EACCES (a TLS file), -ENOTSUP (TLS asked, libmicrohttpd has none),
 * -ENOMEM. The backend must outlive it. */
int gw_start(const struct gw_opts *o, const struct gw_backend *be, struct gw **out);
uint16_t gw_port(const struct gw *g);
/* Stops accepting, cancels what is running, waits for connections to end and for the backend
 * to finish every job it took (gw_job_finish), frees. */
void gw_stop(struct gw *g);

/* ---- for backends ---- */
/* Opaque per-request token the backend may store (e.g. its own request record). */
void gw_job_set_backend_data(struct gw_job *j, void *data);
void *gw_job_backend_data(const struct gw_job *j);
uint64_t gw_job_id(const struct gw_job *j);
/* Prompt accounting, once known (after tokenization / prefill). */
void gw_job_prompt(struct gw_job *j, int prompt_tokens, int cached_tokens);
/* A request with oai->logprobs: the next token's log-probability, called before its
 * gw_job_token (copied). */
void gw_job_logprob(struct gw_job *j, const struct gw_logprob *lp);
/* One generated token's text (may be empty for a partial UTF-8 sequence). */
void gw_job_token(struct gw_job *j, const char *piece, size_t len);
/* Ends the job: finish_reason "stop" or "length" when err == 0; otherwise err (negative
 * errno) and msg describe the failure (sent as an error event / error JSON). Drops the
 * backend's reference: do not touch j afterwards. */
void gw_job_finish(struct gw_job *j, const char *finish_reason, int err, const char *msg);

#endif
