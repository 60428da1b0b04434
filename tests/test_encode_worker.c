/* `kvinfer encode` (issue 26, the disaggregated form): a real encoder worker answers
 * KVW_OP_ENCODE; the first request for an image encodes it and leaves its embeddings in the kv
 * dir, a repeat encodes nothing (encoder metrics), another tenant's salt is another entry, a
 * hash that is not the pixels' and malformed bodies are refused, and the worker stays up. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "img.h"
#include "kvp_frame.h"
#include "kvw.h"
#include "proc_tutil.h"
#include "prom_parse.h"

static char tmpdir[256], bin[512], mmproj[512], kv[512], sec[512], maddr[128];
static pid_t pid = -1;
static uint16_t port, mport;
static struct kvp_secret secret;

static int setup(void **state)
{
	(void)state;
	char model[600], pf[600], mf[600], log[600];
	if (ptu_scratch("test_encode_worker", tmpdir, sizeof(tmpdir), bin, sizeof(bin)))
		return -1;
	snprintf(model, sizeof(model), "%s/m.gguf", tmpdir);
	snprintf(mmproj, sizeof(mmproj), "%s/mmproj.gguf", tmpdir);
	snprintf(kv, sizeof(kv), "%s/kv", tmpdir);
	snprintf(sec, sizeof(sec), "%s/secret", tmpdir);
	mkdir(kv, 0755);
	if (ptu_write_line(sec, "test-encode-secret-0123456789abcdef") ||
	    kvp_secret_load(sec, &secret) || ptu_synth(tmpdir, model, mmproj))
		return -1;
	snprintf(pf, sizeof(pf), "%s/port", tmpdir);
	snprintf(mf, sizeof(mf), "%s/maddr", tmpdir);
	snprintf(log, sizeof(log), "%s/encode.log", tmpdir);
	pid = ptu_encoder(bin, mmproj, kv, sec, pf, mf, log, NULL);
	port = ptu_wait_port(pf);
	if (!port)
		return -1;
	mport = ptu_wait_addr(mf, maddr, sizeof(maddr));
	return mport ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	return ptu_finish(tmpdir, &pid, 1, NULL, 0);
}

/* A w x h picture that seed changes. */
static uint8_t *picture(uint32_t w, uint32_t h, int seed)
{
	uint8_t *p = malloc((size_t)w * h * 3);
	for (size_t i = 0; i < (size_t)w * h * 3; i++)
		p[i] = (uint8_t)(i * 7 + (i / (w * 3)) * 13 + (size_t)seed * 31);
	return p;
}

/* One ENCODE call; the worker's status, *r its reply. bad_hash: a hash not the pixels'. */
static int encode(const char *salt, uint32_t w, uint32_t h, const uint8_t *pix, int bad_hash,
		  struct kvw_encoded *r)
{
	struct kvw_encode q = {.salt = salt, .w = w, .h = h};
	img_hash(pix, w, h, q.hash);
	q.hash[0] ^= (uint8_t)bad_hash;
	struct kvp_wbuf b;
	kvp_w_init(&b);
	assert_int_equal(kvw_encode_enc(&b, &q), 0);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	struct kvp_client *c = NULL;
	int rc = kvp_client_open(addr, &secret, 2000, &c);
	uint8_t *body = NULL;
	uint32_t len = 0;
	if (!rc)
		rc = kvp_call(c, KVW_OP_ENCODE, b.p, b.len, pix, (size_t)w * h * 3, 60000, &body,
			      &len);
	if (!rc)
		assert_int_equal(kvw_encoded_dec(body, len, r), 0);
	free(body);
	kvp_client_close(c);
	kvp_w_free(&b);
	return rc;
}

/* Files named *.kve under dir, recursively. */
static int count_kve(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char p[1024];
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		size_t l = strlen(e->d_name);
		struct stat st;
		if (stat(p, &st))
			continue;
		if (S_ISDIR(st.st_mode))
			n += count_kve(p);
		else if (l > 4 && !strcmp(e->d_name + l - 4, ".kve"))
			n++;
	}
	closedir(d);
	return n;
}

static void test_encode_then_cached(void **state)
{
	(void)state;
	uint8_t *pix = picture(40, 30, 1);
	struct kvw_encoded r1, r2, r3;
	assert_int_equal(encode(NULL, 40, 30, pix, 0, &r1), 0);
	assert_int_equal(r1.cached, 0);
	assert_true(r1.n_tokens > 0 && r1.dim > 0);
	assert_int_equal(count_kve(kv), 1);
	assert_int_equal(ptu_metric(mport, "encoder_encodes_total"), 1);
	assert_int_equal(ptu_metric(mport, "encoder_encode_seconds_count"), 1);

	assert_int_equal(encode(NULL, 40, 30, pix, 0, &r2), 0);
	assert_int_equal(r2.cached, 1);
	assert_int_equal(r2.n_tokens, r1.n_tokens);
	assert_memory_equal(r2.tower_fp, r1.tower_fp, sizeof(r1.tower_fp));
	assert_int_equal(ptu_metric(mport, "encoder_encodes_total"), 1); /* none more */
	assert_int_equal(ptu_metric(mport, "encoder_cache_hits_total"), 1);

	/* another tenant: another entry, encoded */
	assert_int_equal(encode("tenant-b", 40, 30, pix, 0, &r3), 0);
	assert_int_equal(r3.cached, 0);
	assert_int_equal(count_kve(kv), 2);
	assert_int_equal(ptu_metric(mport, "encoder_encodes_total"), 2);
	free(pix);
}

static void test_refused(void **state)
{
	(void)state;
	uint8_t *pix = picture(16, 16, 2);
	struct kvw_encoded r;
	int files = count_kve(kv);
	/* a hash that is not the pixels' would file them under another image */
	assert_int_equal(encode(NULL, 16, 16, pix, 1, &r), -EINVAL);
	assert_int_equal(count_kve(kv), files);
	/* a body whose length is not w x h x 3: the connection closes, the worker stays */
	struct kvw_encode q = {.w = 16, .h = 16};
	struct kvp_wbuf b;
	kvp_w_init(&b);
	assert_int_equal(kvw_encode_enc(&b, &q), 0);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	struct kvp_client *c = NULL;
	assert_int_equal(kvp_client_open(addr, &secret, 2000, &c), 0);
	assert_int_not_equal(
	    kvp_call(c, KVW_OP_ENCODE, b.p, b.len, pix, 16 * 16 * 3 - 1, 10000, NULL, NULL), 0);
	kvp_client_close(c);
	kvp_w_free(&b);
	assert_true(ptu_metric(mport, "encoder_request_errors_total") >= 1);
	/* still serving */
	assert_int_equal(encode(NULL, 16, 16, pix, 0, &r), 0);
	assert_int_equal(r.cached, 0);
	free(pix);
}

/* --device: a name that is no device, or a GPU this machine lacks, stops the worker before it
 * loads anything (exit 1), naming the option. */
static void test_bad_device(void **state)
{
	(void)state;
	static const char *const devs[] = {"bogus", "cuda:7"};
	for (int i = 0; i < 2; i++) {
		char log[600];
		snprintf(log, sizeof(log), "%s/baddev%d.log", tmpdir, i);
		char *argv[] = {bin, "encode",	      "--mmproj", mmproj,     "--kv-dir",
				kv,  "--secret-file", sec,	  "--device", (char *)devs[i],
				NULL};
		pid_t p = ptu_spawn(argv, log);
		int st = 0;
		assert_true(p > 0);
		assert_int_equal(waitpid(p, &st, 0), p);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 1);
		char msg[512] = "";
		FILE *f = fopen(log, "r");
		assert_non_null(f);
		size_t n = fread(msg, 1, sizeof(msg) - 1, f);
		fclose(f);
		msg[n] = 0;
		assert_non_null(strstr(msg, "--device "));
	}
}

static void test_metrics_page(void **state)
{
	(void)state;
	char *page = NULL;
	assert_int_equal(prom_http_get(maddr, "/metrics", &page), 200);
	static const char *const fams[] = {
	    "encoder_requests_total",	 "encoder_request_errors_total", "encoder_cache_hits_total",
	    "encoder_encodes_total",	 "encoder_encode_seconds",	 "encoder_queue_depth",
	    "encoder_requests_in_flight"};
	char why[512] = "";
	int ran = 0;
	int rc = prom_check_page(page, fams, 7, &ran, why, sizeof(why));
	if (rc)
		fail_msg("/metrics: %s", why);
	if (!ran)
		print_message("promtool not installed: lint skipped\n");
	free(page);
}

int main(void)
{
	const struct CMUnitTest t[] = {
	    cmocka_unit_test(test_encode_then_cached),
	    cmocka_unit_test(test_refused),
	    cmocka_unit_test(test_metrics_page),
	    cmocka_unit_test(test_bad_device),
	};
	return cmocka_run_group_tests(t, setup, teardown);
}
