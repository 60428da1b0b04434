/* The direct prefill -> decode KV hand-over (gateway --handoff direct, kvw.h KVW_OP_KV_PUT):
 * real `kvinfer prefill` / `decode` / `gateway` processes on a synthetic model.
 *
 * Processes: one prefill worker P (with a kv dir, B = 16), a decode worker D without a kv dir
 * (B = 16: whatever prompt KV it does not get handed over it must compute itself), a decode
 * worker DS sharing P's kv dir (P then sends only the blocks it did not load from there), a
 * decode worker D32 with B = 32 (refuses the hand-over: another geometry), and four gateways:
 * fs (P -> D, through the kv dir), direct (P -> D), shared (P -> DS, direct) and mismatch
 * (P -> D32, direct). PH and DH are a prefill and a decode worker on the device engine's host
 * backend (fwd_dev.h: device KV, host mirror, coherence hooks) sharing a kv dir of their own,
 * behind an fs and a direct gateway. The local gateway (P -> DS, --local-prefill 1000) sends
 * short prompts straight to the decode worker.
 * Whether D computed a prompt shows in the gateway's lb_replica_prompt_tokens_computed. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "http_tutil.h"
#include "kv.h"
#include "kvp.h"
#include "kvw.h"
#include "model.h"
#include "proc_tutil.h"

enum { W_P, W_D, W_DS, W_D32, W_PH, W_DH, NW };
enum { G_FS, G_DIRECT, G_SHARED, G_MISMATCH, G_HFS, G_HDIRECT, G_LOCAL, NG };

static char tmpdir[256];
static pid_t wpid[NW] = {-1, -1, -1, -1, -1, -1}, gpid[NG] = {-1, -1, -1, -1, -1, -1, -1};
static uint16_t wport[NW], gport[NG];
static struct kvp_secret secret;
static size_t block_bytes; /* D's, B = 16 */

static const char *prompt =
    "You are a helpful assistant. Answer every question about the weather, the trains and the "
    "opening hours of the city library briefly and politely, in plain words, without lists. "
    "Question: when does the library open on Sunday?";

/* Value of "name value" in gateway g's /metrics, or -1. */
static double metric(int g, const char *name)
{
	return ptu_metric(gport[g], name);
}

static double handoffs(int g, const char *how)
{
	char name[96];
	snprintf(name, sizeof(name), "lb_kv_handoffs_total{how=\"%s\"}", how);
	return metric(g, name);
}

/* Decode replica w's figure `what` as gateway g last polled it (every 200 ms). */
static double replica(int g, const char *what, int w)
{
	char name[160];
	snprintf(name, sizeof(name), "lb_replica_%s{role=\"decode\",addr=\"127.0.0.1:%u\"}", what,
		 wport[w]);
	return metric(g, name);
}

/* Waits (bounded: a loaded machine, not a speed check) until gateway g has polled replica w
 * after its last request ended: prompt tokens computed and free KV blocks settled. */
static void settle(int g, int w, double *computed, double *kv_free)
{
	double c = -2, f = -2;
	for (int i = 0; i < 40; i++) {
		ptu_sleep_ms(250);
		double c2 = replica(g, "prompt_tokens_computed", w),
		       f2 = replica(g, "kv_free_blocks", w);
		if (c2 == c && f2 == f && replica(g, "running", w) == 0)
			break;
		c = c2;
		f = f2;
	}
	*computed = c;
	*kv_free = f;
}

/* A greedy completion through gateway g: its text (malloc'd) and *cached, or NULL with *why
 * set. No cmocka assertion: client threads call it too. */
static char *complete_rc(int g, const char *text, int max_tokens, int stream, int *cached,
			 char *why, size_t whylen)
{
	char body[2048], *b = NULL;
	snprintf(body, sizeof(body),
		 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":%s%s}", text,
		 max_tokens, stream ? "true" : "false",
		 stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
	int st = htu_request(gport[g], 0, "POST", "/v1/completions", body, &b);
	char *out = calloc(1, 1 << 16);
	cJSON *usage = NULL, *keep = NULL;
	int bad = st != 200 || !out;
	if (!bad && !stream) {
		keep = cJSON_Parse(b);
		cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(keep, "choices"), 0);
		cJSON *t = cJSON_GetObjectItem(c0, "text");
		if (cJSON_IsString(t))
			snprintf(out, 1 << 16, "%s", t->valuestring);
		usage = cJSON_GetObjectItem(keep, "usage");
	} else if (!bad) {
		for (char *p = b; (p = strstr(p, "data: "));) {
			p += 6;
			char *end = strstr(p, "\n\n");
			if (!end || !strncmp(p, "[DONE]", 6))
				break;
			*end = 0;
			cJSON *e = cJSON_Parse(p);
			bad |= !e || cJSON_GetObjectItem(e, "error");
			cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "choices"), 0);
			cJSON *t = cJSON_GetObjectItem(c0, "text");
			if (cJSON_IsString(t))
				strncat(out, t->valuestring, (1 << 16) - strlen(out) - 1);
			if (cJSON_GetObjectItem(e, "usage")) {
				cJSON_Delete(keep);
				keep = e;
				usage = cJSON_GetObjectItem(e, "usage");
			} else {
				cJSON_Delete(e);
			}
			p = end + 2;
		}
	}
	cJSON *ct = cJSON_GetObjectItem(usage, "completion_tokens");
	cJSON *cd = cJSON_GetObjectItem(cJSON_GetObjectItem(usage, "prompt_tokens_details"),
					"cached_tokens");
	bad |= !cJSON_IsNumber(ct) || ct->valueint != max_tokens || !cJSON_IsNumber(cd);
	if (bad) {
		snprintf(why, whylen, "status %d: %.300s", st, b ? b : "");
		free(out);
		out = NULL;
	} else if (cached) {
		*cached = cd->valueint;
	}
	cJSON_Delete(keep);
	free(b);
	return out;
}

static char *complete(int g, const char *text, int max_tokens, int stream, int *cached)
{
	char why[400];
	char *t = complete_rc(g, text, max_tokens, stream, cached, why, sizeof(why));
	if (!t)
		fail_msg("%s", why);
	return t;
}

static int setup(void **state)
{
	(void)state;
	char bin[512], model[600], kvdir[600], sec[600], pf[640], log[640];
	if (ptu_scratch("test_handoff", tmpdir, sizeof(tmpdir), bin, sizeof(bin)))
		return -1;
	snprintf(model, sizeof(model), "%s/small.gguf", tmpdir);
	snprintf(kvdir, sizeof(kvdir), "%s/kv", tmpdir);
	snprintf(sec, sizeof(sec), "%s/secret", tmpdir);
	mkdir(kvdir, 0755);
	if (ptu_write_line(sec, "test-handoff-secret-0123456789abcdef") ||
	    kvp_secret_load(sec, &secret) || ptu_synth(tmpdir, model, NULL))
		return -1;
	/* D's block size in bytes, for hand-made KV_PUT frames */
	struct kvi_model *m = NULL;
	char err[256];
	if (kvi_model_load(model, &m, err, sizeof(err)))
		return -1;
	struct kvi_kv_geom g = {m->cfg.n_layer, m->cfg.n_head_kv, m->cfg.head_dim, 16};
	struct kvi_kv *kv = NULL;
	if (kvi_kv_create(&g, 1, &kv))
		return -1;
	block_bytes = kvi_kv_block_bytes(kv);
	kvi_kv_destroy(kv);
	kvi_model_free(m);
	static const char *const role[NW] = {"prefill", "decode",  "decode",
					     "decode",	"prefill", "decode"};
	static const char *const btok[NW] = {"16", "16", "16", "32", "16", "16"};
	char kvdir_h[640];
	snprintf(kvdir_h, sizeof(kvdir_h), "%s/kv-host", tmpdir);
	mkdir(kvdir_h, 0755);
	for (int i = 0; i < NW; i++) {
		snprintf(pf, sizeof(pf), "%s/wport%d", tmpdir, i);
		snprintf(log, sizeof(log), "%s/wlog%d", tmpdir, i);
		char *argv[24];
		int a = 0;
		argv[a++] = bin;
		argv[a++] = (char *)role[i];
		argv[a++] = "-m";
		argv[a++] = model;
		if (i == W_P || i == W_DS) {
			argv[a++] = "--kv-dir";
			argv[a++] = kvdir;
		}
		if (i == W_PH || i == W_DH) {
			argv[a++] = "--kv-dir";
			argv[a++] = kvdir_h;
			argv[a++] = "--device";
			argv[a++] = "host";
		}
		char *rest[] = {"--secret-file",
				sec,
				"--port-file",
				pf,
				"-t",
				"1",
				"--block-tokens",
				(char *)btok[i],
				"--ignore-eos",
				"--ctx",
				"1024",
				NULL};
		for (int k = 0; rest[k]; k++)
			argv[a++] = rest[k];
		argv[a] = NULL;
		wpid[i] = ptu_spawn(argv, log);
	}
	if (ptu_wait_ports(tmpdir, "wport", NW, wport))
		return -1;
	static const char *const how[NG] = {"fs", "direct", "direct", "direct",
					    "fs", "direct", "fs"};
	static const int pre[NG] = {W_P, W_P, W_P, W_P, W_PH, W_PH, W_P};
	static const int dec[NG] = {W_D, W_D, W_DS, W_D32, W_DH, W_DH, W_DS};
	for (int i = 0; i < NG; i++) {
		const char *ex[] = {"--handoff", how[i], "--local-prefill",
				    i == G_LOCAL ? "1000" : "0", NULL};
		gpid[i] = ptu_gateway(bin, tmpdir, i, wport[pre[i]], wport[dec[i]], sec, ex);
	}
	return ptu_wait_ports(tmpdir, "gport", NG, gport);
}

static int teardown(void **state)
{
	(void)state;
	return ptu_finish(tmpdir, gpid, NG, wpid, NW);
}

/* Direct = through the kv dir, greedy; with the hand-over D computes no prompt token (it has
 * no kv dir: through fs it computes the whole prompt but the hand-over's last block), and the
 * prefill worker's kv dir still fills for later prompts. */
static void test_direct_same_output(void **state)
{
	(void)state;
	double c0, f0, c1, f1, c2, f2;
	settle(G_DIRECT, W_D, &c0, &f0);
	char *ref = complete(G_FS, prompt, 12, 0, NULL);
	settle(G_DIRECT, W_D, &c1, &f1);
	assert_true(c1 > c0); /* the fs path made D compute (its kv dir is none) */
	double d0 = handoffs(G_DIRECT, "direct");
	int cached = -1;
	char *a = complete(G_DIRECT, prompt, 12, 0, &cached);
	assert_string_equal(a, ref);
	char *b = complete(G_DIRECT, prompt, 12, 1, &cached);
	assert_string_equal(b, ref);
	assert_true(cached >= 16 && cached % 16 == 0); /* P's saves reached its kv dir */
	assert_true(handoffs(G_DIRECT, "direct") == d0 + 2);
	assert_true(handoffs(G_DIRECT, "fallback") == 0);
	settle(G_DIRECT, W_D, &c2, &f2);
	assert_true(c2 == c1); /* D computed no prompt token: it got all of the KV */
	assert_true(f2 == f1); /* and nothing stays parked */
	free(ref);
	free(a);
	free(b);
}

struct cl {
	int id;
	char text[4096];
	int ok;
};

static void *client(void *arg)
{
	struct cl *c = arg;
	char p[160];
	snprintf(p, sizeof(p), "Client %d asks: which trains run to the harbour on Sunday?",
		 c->id % 4);
	char why[400];
	char *t = complete_rc(G_DIRECT, p, 6, c->id & 1, NULL, why, sizeof(why));
	if (!t) {
		fprintf(stderr, "client %d: %s\n", c->id, why);
		return NULL;
	}
	snprintf(c->text, sizeof(c->text), "%s", t);
	free(t);
	c->ok = 1;
	return NULL;
}

/* 20 clients at once: every one handed over, same greedy text per prompt as one at a time
 * through the kv dir, and D's KV back where it was. */
static void test_direct_concurrent(void **state)
{
	(void)state;
	double c0, f0, c1, f1;
	settle(G_DIRECT, W_D, &c0, &f0);
	double d0 = handoffs(G_DIRECT, "direct");
	struct cl cs[20];
	pthread_t th[20];
	for (int i = 0; i < 20; i++) {
		memset(&cs[i], 0, sizeof(cs[i]));
		cs[i].id = i;
		assert_int_equal(pthread_create(&th[i], NULL, client, &cs[i]), 0);
	}
	for (int i = 0; i < 20; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 20; i++) {
		assert_true(cs[i].ok);
		assert_string_equal(cs[i].text, cs[i % 4].text);
	}
	assert_true(handoffs(G_DIRECT, "direct") == d0 + 20);
	settle(G_DIRECT, W_D, &c1, &f1);
	assert_true(c1 == c0);
	assert_true(f1 == f0);
	for (int k = 0; k < 4; k++) {
		char p[160];
		snprintf(p, sizeof(p), "Client %d asks: which trains run to the harbour on Sunday?",
			 k);
		char *ref = complete(G_FS, p, 6, 0, NULL);
		assert_string_equal(ref, cs[k].text);
		free(ref);
	}
}

/* A decode worker of another block size refuses the KV: the request still completes (the
 * decode worker computes the prompt) and counts as a fallback. */
static void test_direct_fallback(void **state)
{
	(void)state;
	double f0 = handoffs(G_MISMATCH, "fallback");
	char *t = complete(G_MISMATCH, prompt, 5, 0, NULL);
	assert_true(strlen(t) > 0);
	free(t);
	assert_true(handoffs(G_MISMATCH, "fallback") == f0 + 1);
	assert_true(handoffs(G_MISMATCH, "direct") == 0);
}

/* One KVW_OP_KV_PUT to worker w: ticket, n token ids (all 1), bb, nb, via, session, then
 * `payload` bytes. Returns the worker's status or a transport error. */
static int put_first(int w, uint64_t ticket, uint32_t n, uint32_t first, uint32_t bb, uint32_t nb,
		     uint8_t via, uint32_t session, size_t payload)
{
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u64(&b, ticket);
	kvp_w_u32(&b, n);
	for (uint32_t i = 0; i < n && i < 4096; i++)
		kvp_w_u32(&b, 1 + i % 7);
	kvp_w_u32(&b, first);
	kvp_w_u32(&b, bb);
	kvp_w_u32(&b, nb);
	kvp_w_u8(&b, via);
	kvp_w_u32(&b, session);
	void *kv = calloc(1, payload + 1);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", wport[w]);
	struct kvp_client *c = NULL;
	int rc = kvp_client_open(addr, &secret, 2000, &c);
	if (!rc) {
		rc = kvp_call(c, KVW_OP_KV_PUT, b.p, b.len, kv, payload, 10000, NULL, NULL);
		kvp_client_close(c);
	}
	kvp_w_free(&b);
	free(kv);
	return rc;
}

static int put(int w, uint64_t ticket, uint32_t n, uint32_t bb, uint32_t nb, uint8_t via,
	       uint32_t session, size_t payload)
{
	return put_first(w, ticket, n, 0, bb, nb, via, session, payload);
}

static int call_op_body(int w, uint16_t op, const void *req, size_t req_len)
{
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", wport[w]);
	struct kvp_client *c = NULL;
	uint8_t *body = NULL;
	uint32_t len = 0;
	int rc = kvp_client_open(addr, &secret, 2000, &c);
	if (!rc) {
		rc = kvp_call(c, op, req, req_len, NULL, 0, 10000, &body, &len);
		kvp_client_close(c);
	}
	free(body);
	return rc;
}

static int call_op(int w, uint16_t op)
{
	return call_op_body(w, op, NULL, 0);
}

/* The requests that carry no body (STATUS, HELLO, NCCL_ID) are refused with one (kvw.h
 * kvw_empty_dec: the frame does not parse), and the worker goes on serving. */
static void test_body_where_none_belongs(void **state)
{
	(void)state;
	static const uint8_t junk[5] = {1, 2, 3, 4, 5};
	assert_int_equal(call_op_body(W_D, KVW_OP_STATUS, junk, sizeof(junk)), -EBADMSG);
	assert_int_equal(call_op_body(W_D, KVW_OP_HELLO, junk, sizeof(junk)), -EBADMSG);
	assert_int_equal(call_op_body(W_D, KVW_OP_NCCL_ID, junk, sizeof(junk)), -EBADMSG);
	assert_int_equal(call_op_body(W_P, KVW_OP_STATUS, junk, 1), -EBADMSG);
	assert_int_equal(call_op(W_D, KVW_OP_STATUS), 0);
	assert_int_equal(call_op(W_D, KVW_OP_HELLO), 0);
	assert_int_equal(call_op(W_P, KVW_OP_STATUS), 0);
}

/* Malformed or refused hand-overs get a clear error and leave the worker serving. */
static void test_put_errors(void **state)
{
	(void)state;
	size_t bb = block_bytes;
	/* 20 tokens of B = 16: 2 blocks */
	assert_int_equal(put(W_D, 7, 20, (uint32_t)bb, 2, 0, 0, 2 * bb), 0);
	assert_int_equal(put(W_D, 7, 20, (uint32_t)bb, 2, 0, 0, 2 * bb), -EEXIST);
	assert_int_equal(put(W_D, 0, 20, (uint32_t)bb, 2, 0, 0, 2 * bb), -EINVAL); /* ticket */
	assert_int_equal(put(W_D, 8, 20, (uint32_t)bb, 1, 0, 0, bb), -EINVAL);	   /* 1 of 2 */
	assert_int_equal(put(W_D, 9, 20, (uint32_t)bb + 2, 2, 0, 0, 2 * bb + 4), -EINVAL);
	assert_int_equal(put(W_D, 10, 20, (uint32_t)bb, 2, 2, 0, 0), -EINVAL); /* via */
	assert_int_equal(put(W_D, 11, 20, (uint32_t)bb, 2, 1, 5, 0), -ENOENT); /* session */
	/* NCCL: the count is checked too (the receiver would wait for blocks never sent) */
	assert_int_equal(put(W_D, 18, 20, (uint32_t)bb, 3, 1, 5, 0), -EINVAL);
	assert_int_equal(put(W_D32, 12, 20, (uint32_t)bb, 2, 0, 0, 2 * bb), -EINVAL);
	assert_int_equal(put(W_P, 13, 20, (uint32_t)bb, 2, 0, 0, 2 * bb), -EOPNOTSUPP);
	/* bytes missing or extra, a count larger than the frame: the frame is bad */
	assert_true(put(W_D, 14, 20, (uint32_t)bb, 2, 0, 0, 2 * bb - 1) != 0);
	assert_true(put(W_D, 15, 20, (uint32_t)bb, 2, 0, 0, 2 * bb + 1) != 0);
	assert_true(put(W_D, 16, 1u << 30, (uint32_t)bb, 2, 0, 0, 0) != 0);
	assert_true(put(W_D, 17, 0, (uint32_t)bb, 0, 0, 0, 0) != 0);
	/* no NCCL on a CPU engine */
	assert_int_equal(call_op(W_D, KVW_OP_NCCL_ID), -EOPNOTSUPP);
	/* still serving: the same output as through the kv dir */
	assert_int_equal(call_op(W_D, KVW_OP_STATUS), 0);
	char *ref = complete(G_FS, prompt, 4, 0, NULL);
	char *t = complete(G_DIRECT, prompt, 4, 0, NULL);
	assert_string_equal(t, ref);
	free(ref);
	free(t);
}

/* A decode worker sharing the prefill worker's kv dir: the hand-over sends only the blocks the
 * prefill worker did not load from it; the decode worker loads those and computes nothing. */
static void test_direct_shared_dir(void **state)
{
	(void)state;
	double c0, f0, c1, f1;
	char *ref = complete(G_FS, prompt, 8, 0, NULL);
	settle(G_SHARED, W_DS, &c0, &f0);
	double d0 = handoffs(G_SHARED, "direct");
	int cached = -1;
	char *a = complete(G_SHARED, prompt, 8, 1, &cached);
	assert_true(cached >= 16); /* P loaded a prefix: DS must load it too */
	assert_string_equal(a, ref);
	assert_true(handoffs(G_SHARED, "direct") == d0 + 1);
	settle(G_SHARED, W_DS, &c1, &f1);
	assert_true(c1 == c0);
	assert_true(f1 == f0);
	/* P learned that DS shares its cache (its log says so on first contact) */
	char path[320], line[512];
	snprintf(path, sizeof(path), "%s/wlog%d", tmpdir, W_P);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	int same = 0;
	char want[64];
	snprintf(want, sizeof(want), ":%u: the same kv dir", wport[W_DS]);
	while (fgets(line, sizeof(line), f))
		same |= strstr(line, want) != NULL;
	fclose(f);
	assert_true(same);
	free(ref);
	free(a);
}

/* The device engine (host backend) on both sides: the same greedy text direct and through the
 * kv dir, the decode worker computing no prompt token with a direct hand-over, also when only
 * the blocks after a cached prefix are sent (the loaded prefix uploaded, the handed blocks
 * imported into the host mirror and uploaded before the first decode step). */
static void test_direct_device_engine(void **state)
{
	(void)state;
	double c0, f0, c1, f1;
	char *ref = complete(G_HFS, prompt, 6, 0, NULL);
	settle(G_HDIRECT, W_DH, &c0, &f0);
	for (int k = 0; k < 2; k++) {
		int cached = -1;
		char *t = complete(G_HDIRECT, prompt, 6, k, &cached);
		assert_string_equal(t, ref);
		assert_true(cached >= 16); /* the fs request saved the prefix */
		free(t);
	}
	settle(G_HDIRECT, W_DH, &c1, &f1);
	assert_true(c1 == c0);
	assert_true(f1 == f0);
	assert_true(handoffs(G_HDIRECT, "direct") == 2);
	free(ref);
}

/* --local-prefill: a short prompt skips the prefill worker (its picks stay), the decode worker
 * computes it (GENERATE) with the same greedy text, saves it to its kv dir and reports the
 * cached prefix of a repeat. */
static void test_local_prefill(void **state)
{
	(void)state;
	char name[160];
	snprintf(name, sizeof(name),
		 "lb_replica_picks_total{role=\"prefill\",addr=\"127.0.0.1:%u\"}", wport[W_P]);
	char *ref = complete(G_FS, prompt, 6, 0, NULL);
	int c1 = -1, c2 = -1;
	char *a = complete(G_LOCAL, prompt, 6, 0, &c1);
	char *b = complete(G_LOCAL, prompt, 6, 1, &c2);
	assert_string_equal(a, ref);
	assert_string_equal(b, ref);
	assert_true(c2 >= 16 && c2 % 16 == 0);
	assert_true(metric(G_LOCAL, name) == 0);
	assert_true(handoffs(G_LOCAL, "local") == 2);
	free(ref);
	free(a);
	free(b);
}

/* Reads DECODE events from fd until the finish; returns its error, and *ntok tokens seen. */
static int decode_events(struct kvp_sock *fd, int *ntok)
{
	for (;;) {
		struct kvp_hdr rh;
		uint8_t *body = NULL;
		int rc = kvp_recv(fd, &rh, &body, KVP_MAX_BODY);
		if (rc)
			return rc;
		if (rh.status) {
			free(body);
			return rh.status;
		}
		struct kvp_rbuf rb;
		kvp_r_init(&rb, body, rh.len);
		uint8_t ev = kvp_r_u8(&rb);
		kvp_r_u8(&rb); /* choice: 0, no further ones asked */
		int32_t err = ev == KVW_EV_FINISH ? (int32_t)kvp_r_u32(&rb) : 0;
		free(body);
		if (ev == KVW_EV_FINISH)
			return err;
		(*ntok)++;
	}
}

/* Connects to worker w and sends it one frame of op with body b; returns the connection. */
static struct kvp_sock *send_frame(int w, uint16_t op, const struct kvp_wbuf *b)
{
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", wport[w]);
	struct kvp_sock *fd = NULL;
	assert_int_equal(kvp_sock_open(addr, &secret, 2000, &fd), 0);
	struct kvp_hdr h = {.op = op, .id = 1};
	assert_int_equal(kvp_send(fd, &h, b->p, b->len, NULL, 0), 0);
	return fd;
}

/* The params field: greedy, seed 1, max_tokens, no penalties, no logit_bias. */
static void w_params(struct kvp_wbuf *w, uint32_t max_tokens)
{
	kvp_w_u32(w, 0); /* temp 0: greedy */
	kvp_w_u32(w, 0x3f800000u);
	kvp_w_u32(w, 0);
	kvp_w_u64(w, 1);
	kvp_w_u32(w, max_tokens);
	kvp_w_u32(w, 0); /* presence_penalty 0.0f */
	kvp_w_u32(w, 0); /* frequency_penalty 0.0f */
	kvp_w_u32(w, 0); /* n_bias */
}

/* A DECODE of the 20 tokens 1 + i % 7 (put_first's), first token 5, no block, to worker w;
 * returns the connection. */
static struct kvp_sock *decode_send(int w, uint64_t ticket, uint32_t max_tokens)
{
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_cstr(&b, "");
	w_params(&b, max_tokens);
	kvp_w_u8(&b, 0); /* no logprobs */
	kvp_w_u32(&b, 20);
	for (int i = 0; i < 20; i++)
		kvp_w_u32(&b, (uint32_t)(1 + i % 7));
	kvp_w_u32(&b, 5); /* first token */
	kvp_w_u32(&b, 0); /* no block */
	kvp_w_u64(&b, ticket);
	kvp_w_u32(&b, 0); /* no further choices */
	kvp_w_u32(&b, 0); /* no images */
	assert_int_equal(b.err, 0);
	struct kvp_sock *fd = send_frame(w, KVW_OP_DECODE, &b);
	kvp_w_free(&b);
	return fd;
}

/* A parked prompt whose first block is not in the decode worker's kv dir: the claim computes
 * those tokens (the worker's prompt_tokens_computed grows by one block) and decodes. */
static void test_parked_prefix_computed(void **state)
{
	(void)state;
	double c0, f0, c1, f1;
	settle(G_SHARED, W_DS, &c0, &f0);
	/* 20 tokens 1 + i % 7 (put_first's), first block from the kv dir (absent), block 2 here */
	assert_int_equal(put_first(W_DS, 4242, 20, 1, (uint32_t)block_bytes, 1, 0, 0, block_bytes),
			 0);
	struct kvp_sock *fd = decode_send(W_DS, 4242, 3);
	int ntok = 0;
	assert_int_equal(decode_events(fd, &ntok), 0);
	kvp_sock_close(fd);
	assert_int_equal(ntok, 3);
	settle(G_SHARED, W_DS, &c1, &f1);
	assert_true(c1 == c0 + 16); /* block 1 computed, block 2 handed over */
	assert_true(f1 == f0);
}

/* CPU seconds (user + system) process p has used, or -1. */
static double cpu_seconds(pid_t p)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)p);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	char *q = strrchr(buf, ')'); /* the command name may hold spaces */
	unsigned long ut = 0, st = 0;
	if (!q ||
	    sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A parked prompt no DECODE claims keeps an idle decode worker idle until it expires (its
 * scheduler once timed that wait on the wrong clock, so it returned at once: a core spun for
 * the whole SCH_PARK_MS). */
static void test_parked_idle(void **state)
{
	(void)state;
	assert_int_equal(put(W_D, 31337, 20, (uint32_t)block_bytes, 2, 0, 0, 2 * block_bytes), 0);
	ptu_sleep_ms(300);
	double a = cpu_seconds(wpid[W_D]);
	ptu_sleep_ms(1000);
	double b = cpu_seconds(wpid[W_D]);
	assert_true(a >= 0 && b >= a);
	/* idle: the gateways' STATUS polls only (a spinning scheduler: ~1 s) */
	if (b - a > 0.3)
		fail_msg("idle decode worker used %.2f s of CPU in 1 s", b - a);
}

/* max_tokens near INT32_MAX from the wire: refused as too long, not an overflow (which let
 * it through); DECODE and GENERATE. */
static void test_max_tokens_huge(void **state)
{
	(void)state;
	struct kvp_sock *fd = decode_send(W_D, 0, 0x7fffffffu);
	int ntok = 0;
	assert_int_equal(decode_events(fd, &ntok), -E2BIG);
	kvp_sock_close(fd);
	assert_int_equal(ntok, 0);
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_cstr(&b, "");
	w_params(&b, 0x7ffffff0u);
	kvp_w_u8(&b, 0); /* no logprobs */
	kvp_w_u8(&b, 0); /* parse_special */
	kvp_w_u32(&b, (uint32_t)strlen(prompt));
	kvp_w_bytes(&b, prompt, strlen(prompt));
	kvp_w_u32(&b, 0); /* no token ids */
	assert_int_equal(b.err, 0);
	fd = send_frame(W_DS, KVW_OP_GENERATE, &b);
	kvp_w_free(&b);
	assert_int_equal(decode_events(fd, &ntok), -E2BIG);
	kvp_sock_close(fd);
	assert_int_equal(ntok, 0);
}

/* A request the workers refuse because of itself (max_tokens past the context left) is the
 * client's error, as when the gateway refuses it: 400 context_length_exceeded, streaming or
 * not (a stream waits for the prompt to be taken before its 200), counted as a client error;
 * and the prefill worker refuses it before computing the prompt, so nothing is handed over.
 * Before: 500 "decode worker refused the request" (a stream: 200, then an error event), after
 * a whole prefill (and a parked hand-over for the direct way). */
static void test_refused_is_client_error(void **state)
{
	(void)state;
	static const int gs[] = {G_FS, G_DIRECT};
	for (size_t i = 0; i < sizeof(gs) / sizeof(gs[0]); i++) {
		int g = gs[i];
		double cerr0 = metric(g, "kvfs_requests_total{outcome=\"client_error\"}");
		double serr0 = metric(g, "kvfs_requests_total{outcome=\"server_error\"}");
		double ho0 = handoffs(g, "fs") + handoffs(g, "direct") + handoffs(g, "fallback");
		for (int stream = 0; stream < 2; stream++) {
			char body[512], *b = NULL;
			snprintf(body, sizeof(body),
				 "{\"prompt\":\"%s\",\"max_tokens\":1020,\"stream\":%s}", prompt,
				 stream ? "true" : "false");
			int st = htu_request(gport[g], 0, "POST", "/v1/completions", body, &b);
			if (st != 400 || !b || !strstr(b, "context_length_exceeded"))
				fail_msg("gateway %d stream %d: %d %s", g, stream, st, b ? b : "");
			free(b);
		}
		assert_true(metric(g, "kvfs_requests_total{outcome=\"client_error\"}") ==
			    cerr0 + 2);
		assert_true(metric(g, "kvfs_requests_total{outcome=\"server_error\"}") == serr0);
		assert_true(handoffs(g, "fs") + handoffs(g, "direct") + handoffs(g, "fallback") ==
			    ho0);
	}
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A decode worker that hangs (SIGSTOP) mid-stream: the gateway's health check marks it down
 * and, HUNG_MS later, breaks the stream, which ends with an error event and [DONE]. Before,
 * the stream stayed open and silent for as long as the worker was stopped (the 60 s receive
 * timeout here). The worker, continued, is taken up again and serves. */
static void test_hung_decode_replica(void **state)
{
	(void)state;
	int fd = htu_connect(gport[G_FS]);
	assert_true(fd >= 0);
	char body[512];
	snprintf(body, sizeof(body),
		 "{\"prompt\":\"%s\",\"max_tokens\":700,\"temperature\":0,\"stream\":true}",
		 prompt);
	assert_int_equal(htu_send(fd, 0, "POST", "/v1/completions", body), 0);
	struct timeval tv = {.tv_sec = 60};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	ssize_t n = 0;
	int stopped = 0;
	double t0 = 0;
	while (len + 1 < cap && (n = recv(fd, buf + len, cap - 1 - len, 0)) > 0) {
		len += (size_t)n;
		buf[len] = 0;
		if (!stopped && strstr(buf, "data: ")) { /* tokens are flowing */
			assert_int_equal(kill(wpid[W_D], SIGSTOP), 0);
			stopped = 1;
			t0 = now_s();
		}
	}
	int eof = n == 0;
	double waited = now_s() - t0;
	if (stopped)
		kill(wpid[W_D], SIGCONT);
	close(fd);
	buf[len] = 0;
	if (!stopped)
		fail_msg("no token came: %.300s", buf);
	fprintf(stderr, "  stream ended %.1f s after the decode worker stopped\n", waited);
	assert_true(eof); /* not the receive timeout */
	assert_non_null(strstr(buf, "\"error\""));
	assert_non_null(strstr(buf, "data: [DONE]"));
	free(buf);
	char name[128];
	snprintf(name, sizeof(name), "lb_replica_up{role=\"decode\",addr=\"127.0.0.1:%u\"}",
		 wport[W_D]);
	for (int i = 0; i < 100 && metric(G_FS, name) != 1; i++)
		usleep(100000);
	assert_true(metric(G_FS, name) == 1);
	int cached = 0;
	char *t = complete(G_FS, prompt, 4, 0, &cached);
	assert_non_null(t);
	free(t);
}

/* A fake prefill worker: STATUS answered (idle), every PREFILL answered with a reply that
 * does not parse (one byte too many). */
static int fake_pf_handler(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	(void)ctx;
	free(body);
	struct kvp_wbuf b;
	kvp_w_init(&b);
	if (h->op == KVW_OP_STATUS) {
		for (int i = 0; i < 6; i++)
			kvp_w_u32(&b, 0);
	} else {
		kvp_w_u32(&b, 1); /* n, ids */
		kvp_w_u32(&b, 1);
		kvp_w_u32(&b, 0); /* cached, first, no lp, nx, handed, blen */
		kvp_w_u32(&b, 1);
		kvp_w_u8(&b, 0);
		kvp_w_u32(&b, 0);
		kvp_w_u8(&b, 0);
		kvp_w_u32(&b, 0);
		kvp_w_u8(&b, 0xee); /* trailing */
	}
	kvp_reply(c, h, b.err, b.p, b.len, NULL, 0);
	kvp_w_free(&b);
	return 0;
}

/* A prefill worker whose reply does not parse: the request fails with an error and the
 * gateway goes on (it freed the reply's buffer twice: a crash, or an ASan report). */
static void test_bad_prefill_reply(void **state)
{
	(void)state;
	struct kvp_server_opts so = {.name = "fake-prefill",
				     .host = "127.0.0.1",
				     .secret = &secret,
				     .handler = fake_pf_handler};
	struct kvp_server *srv = NULL;
	assert_int_equal(kvp_server_start(&so, &srv), 0);
	const char *bd = getenv("KVFS_BUILD_DIR");
	char bin[512], sec[300], pf[300], log[300];
	snprintf(bin, sizeof(bin), "%s/bin/kvinfer", bd ? bd : "build");
	snprintf(sec, sizeof(sec), "%s/secret", tmpdir);
	snprintf(pf, sizeof(pf), "%s/gport-bad", tmpdir);
	snprintf(log, sizeof(log), "%s/glog-bad", tmpdir);
	pid_t g = ptu_gateway_at(bin, pf, log, kvp_server_port(srv), wport[W_D], sec, NULL);
	uint16_t port = ptu_wait_port(pf);
	assert_true(port != 0);
	int errors = 0;
	for (int i = 0; i < 3; i++) { /* a double free need not crash at the first */
		char *b = NULL;
		int st =
		    htu_request(port, 0, "POST", "/v1/completions",
				"{\"prompt\":\"hello\",\"max_tokens\":2,\"temperature\":0}", &b);
		errors += st >= 500;
		free(b);
	}
	char *b = NULL;
	int st = htu_request(port, 0, "GET", "/v1/models", NULL, &b);
	free(b);
	int alive = waitpid(g, NULL, WNOHANG) == 0;
	FILE *f = fopen(log, "r");
	char line[512];
	int bad = 0;
	while (f && fgets(line, sizeof(line), f))
		bad |= strstr(line, "Sanitizer") != NULL || strstr(line, "double free") != NULL;
	if (f)
		fclose(f);
	ptu_stop(&g);
	kvp_server_stop(srv);
	assert_true(alive);
	assert_false(bad);
	assert_int_equal(st, 200);
	assert_int_equal(errors, 3);
}

/* Every process is still running and none logged a sanitizer report (ASan/UBSan builds). */
static void test_processes_healthy(void **state)
{
	(void)state;
	ptu_assert_healthy(tmpdir, wpid, NW, gpid, NG);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_direct_same_output),
	    cmocka_unit_test(test_direct_concurrent),
	    cmocka_unit_test(test_direct_shared_dir),
	    cmocka_unit_test(test_parked_prefix_computed),
	    cmocka_unit_test(test_direct_device_engine),
	    cmocka_unit_test(test_local_prefill),
	    cmocka_unit_test(test_direct_fallback),
	    cmocka_unit_test(test_put_errors),
	    cmocka_unit_test(test_body_where_none_belongs),
	    cmocka_unit_test(test_parked_idle),
	    cmocka_unit_test(test_max_tokens_huge),
	    cmocka_unit_test(test_refused_is_client_error),
	    cmocka_unit_test(test_hung_decode_replica),
	    cmocka_unit_test(test_bad_prefill_reply),
	    cmocka_unit_test(test_processes_healthy),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
