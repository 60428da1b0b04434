/* The direct prefill -> decode hand-over over NCCL (gateway --handoff direct, prefill --nccl):
 * real `kvinfer prefill --device cuda --nccl` and `kvinfer decode --device cuda` processes on a
 * synthetic model, the prefill worker on GPU 1 and the decode worker on GPU 0.
 *
 * Needs two GPUs and NCCL: exits 77 ("skipped") otherwise. On the CUDA emulation
 * (-DKVFS_CUDA=EMU, docs/cuda-emu.md) it runs as emu_test_handoff_nccl with two emulated devices
 * per process and NCCL between the two processes over the emulator's sockets.
 *
 * Processes: P (prefill, kv dir), D (decode, no kv dir: any prompt KV it is not handed it must
 * compute), gateways FS (P -> D through the kv dir, the reference) and NC (P -> D direct). */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "http_tutil.h"
#include "kv.h"
#include "kvk_cuda.h"
#include "kvk_nccl.h"
#include "kvp.h"
#include "kvw.h"
#include "model.h"
#include "proc_tutil.h"

enum { W_P, W_D, NW };
enum { G_FS, G_NC, NG };

static char tmpdir[256];
static pid_t wpid[NW] = {-1, -1}, gpid[NG] = {-1, -1};
static uint16_t wport[NW], gport[NG];

static const char *const prompts[3] = {
    "You are a helpful assistant. Answer every question about the weather, the trains and the "
    "opening hours of the city library briefly and politely. Question: when does it open?",
    "Summarise the timetable of the harbour ferries for a visitor who arrives on a Sunday "
    "morning and wants to reach the old town before noon, in two sentences.",
    "List what a careful cook checks before serving fish: smell, colour, firmness and the "
    "temperature at the thickest part, and say why each one matters."};

/* The greedy completion's text (malloc'd) through gateway g, or NULL with why set. */
static char *complete(int g, const char *text, int max_tokens, char *why, size_t whylen)
{
	char body[1024], *b = NULL;
	snprintf(body, sizeof(body), "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}",
		 text, max_tokens);
	int st = htu_request(gport[g], 0, "POST", "/v1/completions", body, &b);
	cJSON *j = st == 200 ? cJSON_Parse(b) : NULL;
	cJSON *t =
	    cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
	char *out = cJSON_IsString(t) ? strdup(t->valuestring) : NULL;
	if (!out)
		snprintf(why, whylen, "status %d: %.300s", st, b ? b : "");
	cJSON_Delete(j);
	free(b);
	return out;
}

static double gw(int g, const char *name)
{
	return ptu_metric(gport[g], name);
}

/* D's prompt tokens computed, once the gateway has polled it after its last request. */
static double d_computed(int g)
{
	char name[160];
	snprintf(name, sizeof(name),
		 "lb_replica_prompt_tokens_computed{role=\"decode\",addr=\"127.0.0.1:%u\"}",
		 wport[W_D]);
	double c = -2;
	for (int i = 0; i < 40; i++) {
		ptu_sleep_ms(250);
		double c2 = gw(g, name);
		if (c2 == c)
			break;
		c = c2;
	}
	return c;
}

static char bin[512], model[600], kvdir[600], sec[600];
static struct kvp_secret secret;
static size_t block_bytes; /* D's, B = 16 */

/* Starts worker i (its log gets a run number: a restart keeps the first one's). listen: a
 * host:port to bind, or NULL for any port. */
static pid_t start_worker(int i, const char *listen)
{
	static int runs;
	char pf[640], log[640];
	snprintf(pf, sizeof(pf), "%s/wport%d", tmpdir, i);
	snprintf(log, sizeof(log), "%s/wlog%d%s", tmpdir, i, runs++ >= NW ? ".2" : "");
	unlink(pf);
	char *argv[24] = {bin,
			  i == W_P ? "prefill" : "decode",
			  "-m",
			  model,
			  "--device",
			  i == W_P ? "cuda:1" : "cuda:0",
			  "--secret-file",
			  sec,
			  "--port-file",
			  pf,
			  "-t",
			  "1",
			  "--block-tokens",
			  "16",
			  "--ignore-eos",
			  "--ctx",
			  "1024"};
	int a = 17;
	if (i == W_P) { /* D has no kv dir; the prefill side asks for NCCL */
		argv[a++] = "--kv-dir";
		argv[a++] = kvdir;
		argv[a++] = "--nccl";
	}
	if (listen) {
		argv[a++] = "--listen";
		argv[a++] = (char *)listen;
	}
	argv[a] = NULL;
	return ptu_spawn(argv, log);
}

static int setup(void **state)
{
	(void)state;
	if (ptu_scratch("test_handoff_nccl", tmpdir, sizeof(tmpdir), bin, sizeof(bin)))
		return -1;
	snprintf(model, sizeof(model), "%s/small.gguf", tmpdir);
	snprintf(kvdir, sizeof(kvdir), "%s/kv", tmpdir);
	snprintf(sec, sizeof(sec), "%s/secret", tmpdir);
	mkdir(kvdir, 0755);
	if (ptu_write_line(sec, "test-handoff-nccl-secret-0123456789") ||
	    kvp_secret_load(sec, &secret) || ptu_synth(tmpdir, model, NULL))
		return -1;
	struct kvi_model *m = NULL;
	char err[256];
	if (kvi_model_load(model, &m, err, sizeof(err)))
		return -1;
	struct kvi_kv_geom g = {m->cfg.n_layer, m->cfg.n_head_kv, m->cfg.head_dim, 16};
	struct kvi_kv *kv = NULL;
	int krc = kvi_kv_create(&g, 1, &kv);
	if (!krc)
		block_bytes = kvi_kv_block_bytes(kv);
	kvi_kv_destroy(kv);
	kvi_model_free(m);
	if (krc)
		return -1;
	for (int i = 0; i < NW; i++)
		if ((wpid[i] = start_worker(i, NULL)) < 0)
			return -1;
	if (ptu_wait_ports(tmpdir, "wport", NW, wport))
		return -1;
	for (int i = 0; i < NG; i++) {
		const char *ex[] = {"--handoff", i == G_FS ? "fs" : "direct", NULL};
		gpid[i] = ptu_gateway(bin, tmpdir, i, wport[W_P], wport[W_D], sec, ex);
	}
	return ptu_wait_ports(tmpdir, "gport", NG, gport);
}

static int teardown(void **state)
{
	(void)state;
	return ptu_finish(tmpdir, gpid, NG, wpid, NW);
}

static char *refs[3];

/* The KV goes over NCCL: the same greedy text as through the kv dir (where D computes the
 * prompt itself), D computes no prompt token, the gateway counts direct hand-overs, none
 * falls back, and the prefill worker set up a communicator with D. */
static void test_nccl_same_output(void **state)
{
	(void)state;
	char why[400];
	double c0 = d_computed(G_FS);
	for (int i = 0; i < 3; i++)
		if (!(refs[i] = complete(G_FS, prompts[i], 8, why, sizeof(why))))
			fail_msg("fs: %s", why);
	double c1 = d_computed(G_FS);
	assert_true(c1 > c0); /* through fs D computed the prompts */
	double d0 = gw(G_NC, "lb_kv_handoffs_total{how=\"direct\"}");
	for (int i = 0; i < 3; i++) {
		char *t = complete(G_NC, prompts[i], 8, why, sizeof(why));
		if (!t)
			fail_msg("direct: %s", why);
		assert_string_equal(t, refs[i]);
		free(t);
	}
	assert_true(gw(G_NC, "lb_kv_handoffs_total{how=\"direct\"}") == d0 + 3);
	assert_true(gw(G_NC, "lb_kv_handoffs_total{how=\"fallback\"}") == 0);
	assert_true(d_computed(G_NC) == c1); /* D got all of the prompts' KV */
	char path[320];
	snprintf(path, sizeof(path), "%s/wlog%d", tmpdir, W_P);
	assert_true(ptu_log_has(path, "hand-overs by NCCL"));
	assert_false(ptu_log_has(path, "NCCL hand-over to"));	   /* no transfer failed */
	assert_false(ptu_log_has(path, "hand-overs go as bytes")); /* no setup failed */
}

struct cl {
	int id, ok;
	char *text;
	char why[400];
};

static void *client(void *arg)
{
	struct cl *c = arg;
	c->text = complete(G_NC, prompts[c->id % 3], 8, c->why, sizeof(c->why));
	c->ok = c->text && !strcmp(c->text, refs[c->id % 3]);
	return NULL;
}

/* Six clients at once: each prompt's KV over the one communicator, each text as through fs. */
static void test_nccl_concurrent(void **state)
{
	(void)state;
	assert_non_null(refs[2]);
	double d0 = gw(G_NC, "lb_kv_handoffs_total{how=\"direct\"}");
	struct cl cs[6];
	pthread_t th[6];
	for (int i = 0; i < 6; i++) {
		memset(&cs[i], 0, sizeof(cs[i]));
		cs[i].id = i;
		assert_int_equal(pthread_create(&th[i], NULL, client, &cs[i]), 0);
	}
	for (int i = 0; i < 6; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 6; i++) {
		if (!cs[i].ok)
			fail_msg("client %d: %s (got \"%s\")", i, cs[i].why,
				 cs[i].text ? cs[i].text : "");
		free(cs[i].text);
	}
	assert_true(gw(G_NC, "lb_kv_handoffs_total{how=\"direct\"}") == d0 + 6);
	assert_true(gw(G_NC, "lb_kv_handoffs_total{how=\"fallback\"}") == 0);
}

/* The decode worker dies (SIGKILL) and comes back on its port: the prefill worker's
 * communicator with it is stale. The next hand-over announces the old session, the new decode
 * worker refuses it, the prefill worker's watchdog aborts its send (which waits for a peer that
 * is gone), drops the communicator and falls back to the kv dir (same text); the one after sets
 * up a new communicator and goes over NCCL again. */
static void test_nccl_decode_restart(void **state)
{
	(void)state;
	assert_non_null(refs[0]);
	char listen[64], why[400];
	snprintf(listen, sizeof(listen), "127.0.0.1:%u", wport[W_D]);
	kill(wpid[W_D], SIGKILL);
	waitpid(wpid[W_D], NULL, 0);
	wpid[W_D] = start_worker(W_D, listen);
	char pf[640];
	snprintf(pf, sizeof(pf), "%s/wport%d", tmpdir, W_D);
	assert_int_equal(ptu_wait_port(pf), wport[W_D]);
	/* the gateway sees the decode replica up again */
	char up[128];
	snprintf(up, sizeof(up), "lb_replica_up{role=\"decode\",addr=\"%s\"}", listen);
	for (int i = 0; i < 100 && gw(G_NC, up) != 1; i++)
		ptu_sleep_ms(100);
	assert_true(gw(G_NC, up) == 1);
	double d0 = gw(G_NC, "lb_kv_handoffs_total{how=\"direct\"}");
	double f0 = gw(G_NC, "lb_kv_handoffs_total{how=\"fallback\"}");
	char *t = complete(G_NC, prompts[0], 8, why, sizeof(why));
	if (!t)
		fail_msg("after the restart: %s", why);
	assert_string_equal(t, refs[0]);
	free(t);
	assert_true(gw(G_NC, "lb_kv_handoffs_total{how=\"fallback\"}") == f0 + 1);
	t = complete(G_NC, prompts[1], 8, why, sizeof(why));
	if (!t)
		fail_msg("second request after the restart: %s", why);
	assert_string_equal(t, refs[1]);
	free(t);
	assert_true(gw(G_NC, "lb_kv_handoffs_total{how=\"direct\"}") == d0 + 1);
	assert_true(gw(G_NC, "lb_kv_handoffs_total{how=\"fallback\"}") == f0 + 1);
	/* the new decode worker's session id is not its previous run's */
	snprintf(pf, sizeof(pf), "%s/wlog%d", tmpdir, W_P);
	FILE *f = fopen(pf, "r");
	assert_non_null(f);
	char line[512];
	unsigned sess[2] = {0, 0};
	int n = 0;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "NCCL communicator with");
		if (p && (p = strstr(p, "(session ")) && n < 2)
			sess[n++] = (unsigned)strtoul(p + 9, NULL, 10);
	}
	fclose(f);
	assert_int_equal(n, 2);
	assert_true(sess[0] != sess[1]);
}

/* D's free KV blocks once the gateway has polled it twice with the same figure. */
static double d_kv_free(void)
{
	char name[160];
	snprintf(name, sizeof(name),
		 "lb_replica_kv_free_blocks{role=\"decode\",addr=\"127.0.0.1:%u\"}", wport[W_D]);
	double f = -2;
	for (int i = 0; i < 40; i++) {
		ptu_sleep_ms(250);
		double f2 = gw(G_NC, name);
		if (f2 == f)
			break;
		f = f2;
	}
	return f;
}

/* A prefill worker that announces an NCCL hand-over (KV_PUT via 1) and never sends: this test
 * joins D's communicator as rank 1 itself (KVW_OP_NCCL_ID, then kvk_nccl_comm_create on its
 * own GPU 1), puts 2 blocks' worth of a 20-token prompt and stops there. D's watchdog aborts the
 * receive after PUT_TIMEOUT_MS (30 s) and answers -ETIMEDOUT; nothing stays parked (an aborted
 * receive is an error, not 2 blocks of undefined KV held for SCH_PARK_MS), and D serves on. */
static void test_nccl_receiver_watchdog(void **state)
{
	(void)state;
	assert_non_null(refs[2]);
	double free0 = d_kv_free();
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", wport[W_D]);
	struct kvp_client *cl = NULL;
	assert_int_equal(kvp_client_open(addr, &secret, 2000, &cl), 0);
	uint8_t *body = NULL;
	uint32_t len = 0;
	assert_int_equal(kvp_call(cl, KVW_OP_NCCL_ID, NULL, 0, NULL, 0, 10000, &body, &len), 0);
	assert_int_equal(len, 4 + KVK_NCCL_ID_BYTES);
	uint32_t session;
	memcpy(&session, body, 4); /* little-endian on the wire, as on every machine here */
	struct kvk_cuda_ctx *ctx = NULL;
	struct kvk_nccl *comm = NULL;
	assert_int_equal(kvk_cuda_ctx_create(1, &ctx), 0);
	assert_int_equal(kvk_nccl_comm_create(&comm, ctx, body + 4, 2, 1), 0);
	free(body);
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u64(&b, 0x5eed);
	kvp_w_u32(&b, 20);
	for (int i = 0; i < 20; i++)
		kvp_w_u32(&b, 1 + i % 7);
	kvp_w_u32(&b, 0);
	kvp_w_u32(&b, (uint32_t)block_bytes);
	kvp_w_u32(&b, 2);
	kvp_w_u8(&b, 1);
	kvp_w_u32(&b, session);
	assert_int_equal(b.err, 0);
	int rc = kvp_call(cl, KVW_OP_KV_PUT, b.p, b.len, NULL, 0, 60000, NULL, NULL);
	kvp_w_free(&b);
	assert_int_equal(rc, -ETIMEDOUT);
	assert_true(d_kv_free() == free0);
	kvp_client_close(cl);
	kvk_nccl_comm_destroy(comm);
	kvk_cuda_ctx_destroy(ctx);
	char why[400];
	char *t = complete(G_NC, prompts[2], 8, why, sizeof(why));
	if (!t)
		fail_msg("after the watchdog: %s", why);
	assert_string_equal(t, refs[2]);
	free(t);
}

/* Every process still runs and none logged a sanitizer report. */
static void test_processes_healthy(void **state)
{
	(void)state;
	ptu_assert_healthy(tmpdir, wpid, NW, gpid, NG);
	char path[320];
	snprintf(path, sizeof(path), "%s/wlog%d.2", tmpdir, W_D); /* the restarted D */
	if (!ptu_log_clean(path))
		fail_msg("%s has a sanitizer report", path);
	for (int i = 0; i < 3; i++)
		free(refs[i]);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	if (!kvk_nccl_available() || kvk_cuda_device_count() < 2) {
		printf("skipped: needs 2 GPUs and NCCL (found %d GPUs%s)\n",
		       kvk_cuda_device_count(), kvk_nccl_available() ? "" : ", no NCCL");
		return 77;
	}
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_nccl_same_output),
	    cmocka_unit_test(test_nccl_concurrent),
	    cmocka_unit_test(test_nccl_receiver_watchdog),
	    cmocka_unit_test(test_nccl_decode_restart),
	    cmocka_unit_test(test_processes_healthy),
	};
	return cmocka_run_group_tests_name("handoff_nccl", tests, setup, teardown);
}
