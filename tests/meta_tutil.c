/* Helpers for tests/test_meta.c (meta_tutil.h). */
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta_tutil.h"

/* ---- the daemon as a child process ---- */

char g_dir[256];
struct kvp_secret g_secret;

void sleep_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&t, NULL);
}

void daemon_start2(struct daemon *d, const char *db, const char *node_timeout, const char *extra)
{
	char bin[512], addrf[400];
	const char *b = getenv("KVFS_BUILD_DIR");
	snprintf(bin, sizeof(bin), "%s/bin/kvfs-meta", b ? b : ".");
	snprintf(d->db, sizeof(d->db), "%s/%s", g_dir, db);
	snprintf(addrf, sizeof(addrf), "%s/%s.addr", g_dir, db);
	unlink(addrf);
	char secretf[300];
	snprintf(secretf, sizeof(secretf), "%s/secret", g_dir);
	d->pid = fork();
	assert_true(d->pid >= 0);
	if (d->pid == 0) {
		execl(bin, bin, "--listen", "127.0.0.1:0", "--db", d->db, "--secret-file", secretf,
		      "--addr-file", addrf, "--node-timeout", node_timeout, "--gc-interval", "0.1s",
		      "--unlink-delay", "0", "--atime-granularity", "0", "--log-level",
		      getenv("KVFS_META_LOG") ? "3" : "1", extra, (char *)NULL);
		perror("exec kvfs-meta");
		_exit(127);
	}
	for (int i = 0; i < 1000; i++) { /* up to 10 s */
		FILE *f = fopen(addrf, "r");
		if (f) {
			int ok = fgets(d->addr, sizeof(d->addr), f) != NULL;
			fclose(f);
			if (ok) {
				d->addr[strcspn(d->addr, "\n")] = 0;
				return;
			}
		}
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid)
			fail_msg("kvfs-meta exited during start (status %d)", st);
		sleep_ms(10);
	}
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	fail_msg("kvfs-meta did not write its address file");
}

void daemon_start(struct daemon *d, const char *db, const char *node_timeout)
{
	daemon_start2(d, db, node_timeout, NULL);
}

/* Stops with sig (SIGTERM: expects exit 0); SIGKILL after 10 s. Always reaps. */
void daemon_stop(struct daemon *d, int sig)
{
	if (d->pid <= 0)
		return;
	kill(d->pid, sig);
	int st = 0;
	for (int i = 0; i < 1000; i++) {
		if (waitpid(d->pid, &st, WNOHANG) == d->pid)
			break;
		if (i == 999) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
			d->pid = 0;
			fail_msg("kvfs-meta ignored signal %d", sig);
		}
		sleep_ms(10);
	}
	d->pid = 0;
	if (sig == SIGTERM)
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	else
		assert_true(WIFSIGNALED(st) && WTERMSIG(st) == sig);
}

struct kvp_client *connect_to(const struct daemon *d)
{
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(d->addr, &g_secret, TMO, &c), 0);
	return c;
}

/* ---- a fake storage node: records every chunk id it is asked to delete ---- */

struct dels_state g_dels = {.mu = PTHREAD_MUTEX_INITIALIZER};

int fake_node(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	(void)ctx;
	struct kvp_rbuf r;
	kvp_r_init(&r, body, h->len);
	if (h->op != KVP_OP_DEL) {
		free(body);
		kvp_reply(c, h, -EOPNOTSUPP, NULL, 0, NULL, 0);
		return 0;
	}
	uint32_t n = kvp_r_u32(&r);
	pthread_mutex_lock(&g_dels.mu);
	int fail = g_dels.fail;
	for (uint32_t i = 0; i < n && !r.err && !fail; i++) {
		if (g_dels.n == g_dels.cap) {
			g_dels.cap = g_dels.cap ? 2 * g_dels.cap : 1024;
			g_dels.ids = realloc(g_dels.ids, g_dels.cap * sizeof(uint64_t));
		}
		g_dels.ids[g_dels.n++] = kvp_r_u64(&r);
	}
	pthread_mutex_unlock(&g_dels.mu);
	uint8_t out[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
	kvp_reply(c, h, fail ? -EIO : 0, out, 4, NULL, 0);
	free(body);
	return 0;
}

int deleted(uint64_t id)
{
	int found = 0;
	pthread_mutex_lock(&g_dels.mu);
	for (size_t i = 0; i < g_dels.n && !found; i++)
		found = g_dels.ids[i] == id;
	pthread_mutex_unlock(&g_dels.mu);
	return found;
}

/* Waits up to 3 s until every one of ids[0..n-1] has been deleted on a node. */
int all_deleted(const uint64_t *ids, size_t n)
{
	for (int t = 0; t < 300; t++) {
		size_t i = 0;
		while (i < n && deleted(ids[i]))
			i++;
		if (i == n)
			return 1;
		sleep_ms(10);
	}
	return 0;
}

/* ---- 12 fake nodes heartbeating from a thread ---- */

struct nodes_state g_nodes = {.mu = PTHREAD_MUTEX_INITIALIZER};

int call(struct kvp_client *c, uint16_t op, struct kvp_wbuf *w, uint8_t **rb, uint32_t *rl)
{
	assert_int_equal(w->err, 0);
	int rc = kvp_call(c, op, w->p, w->len, NULL, 0, TMO, rb, rl);
	kvp_w_free(w);
	kvp_w_init(w);
	return rc;
}

int heartbeat(struct kvp_client *c, uint64_t uuid, const char *addr, uint64_t cap, uint64_t used,
	      uint32_t *id)
{
	return heartbeat_z(c, uuid, addr, cap, used, NULL, id);
}

int heartbeat_z(struct kvp_client *c, uint64_t uuid, const char *addr, uint64_t cap, uint64_t used,
		const char *zone, uint32_t *id)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, uuid);
	kvp_w_cstr(&w, addr);
	kvp_w_u64(&w, cap);
	kvp_w_u64(&w, used);
	kvp_w_u64(&w, 0);
	if (zone && *zone)
		kvp_w_cstr(&w, zone);
	uint8_t *b = NULL;
	uint32_t l = 0;
	int rc = call(c, KVP_OP_HEARTBEAT, &w, &b, &l);
	if (!rc) {
		assert_int_equal(l, 4);
		*id = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
		      (uint32_t)b[3] << 24;
	}
	free(b);
	return rc;
}

void heartbeat_all(struct kvp_client *c)
{
	for (int i = 0; i < NNODES; i++) {
		pthread_mutex_lock(&g_nodes.mu);
		int silent = g_nodes.silent[i];
		uint64_t cap = g_nodes.cap[i], used = g_nodes.used[i];
		char zone[KVP_ZONE_MAX];
		memcpy(zone, g_nodes.zone[i], sizeof(zone));
		pthread_mutex_unlock(&g_nodes.mu);
		if (silent)
			continue;
		uint32_t id;
		if (heartbeat_z(c, 1000 + (uint64_t)i, g_nodes.addr, cap, used, zone, &id) == 0) {
			pthread_mutex_lock(&g_nodes.mu);
			g_nodes.id[i] = id;
			pthread_mutex_unlock(&g_nodes.mu);
		}
	}
}

void *hb_main(void *arg)
{
	(void)arg;
	struct kvp_client *c = NULL;
	while (!atomic_load(&g_nodes.stop)) {
		if (!c && kvp_client_open(g_nodes.d->addr, &g_secret, TMO, &c))
			c = NULL;
		if (c) {
			heartbeat_all(c);
			atomic_fetch_add(&g_nodes.rounds, 1);
			if (!kvp_client_alive(c)) {
				kvp_client_close(c);
				c = NULL;
			}
		}
		sleep_ms(150);
	}
	kvp_client_close(c);
	return NULL;
}

void hb_wait_round(void)
{
	/* The round in progress may have read g_nodes before the change: wait for two ends. */
	unsigned r0 = atomic_load(&g_nodes.rounds);
	for (int i = 0; i < 2000 && atomic_load(&g_nodes.rounds) < r0 + 2; i++)
		sleep_ms(10);
	assert_true(atomic_load(&g_nodes.rounds) >= r0 + 2);
}

/* ---- client-side wrappers for the ops ---- */

void attr_of(const uint8_t *b, uint32_t l, struct kvp_attr *a)
{
	struct kvp_rbuf r;
	kvp_r_init(&r, b, l);
	kvp_r_attr(&r, a);
	assert_int_equal(kvp_r_end(&r), 0);
}

int name_op(struct kvp_client *c, uint16_t op, uint64_t parent, const char *name, size_t nlen,
	    uint32_t mode, struct kvp_attr *a)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, parent);
	kvp_w_str(&w, name, nlen);
	if (op == KVP_OP_MKDIR)
		kvp_w_u32(&w, mode);
	uint8_t *b = NULL;
	uint32_t l = 0;
	int rc = call(c, op, &w, &b, &l);
	if (!rc && (op == KVP_OP_LOOKUP || op == KVP_OP_MKDIR))
		attr_of(b, l, a);
	if (!rc && (op == KVP_OP_RMDIR || op == KVP_OP_UNLINK))
		assert_int_equal(l, 0);
	free(b);
	return rc;
}

int mkdir_(struct kvp_client *c, uint64_t parent, const char *name, struct kvp_attr *a)
{
	return name_op(c, KVP_OP_MKDIR, parent, name, strlen(name), 0755, a);
}

int lookup(struct kvp_client *c, uint64_t parent, const char *name, struct kvp_attr *a)
{
	return name_op(c, KVP_OP_LOOKUP, parent, name, strlen(name), 0, a);
}

int getattr(struct kvp_client *c, uint64_t ino, struct kvp_attr *a)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, ino);
	uint8_t *b = NULL;
	uint32_t l = 0;
	int rc = call(c, KVP_OP_GETATTR, &w, &b, &l);
	if (!rc)
		attr_of(b, l, a);
	free(b);
	return rc;
}

int rename_(struct kvp_client *c, uint64_t p, const char *n, uint64_t np, const char *nn,
	    uint32_t flags)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, p);
	kvp_w_cstr(&w, n);
	kvp_w_u64(&w, np);
	kvp_w_cstr(&w, nn);
	kvp_w_u32(&w, flags);
	return call(c, KVP_OP_RENAME, &w, NULL, NULL);
}

int alloc_(struct kvp_client *c, int k, int m, uint32_t cs, uint32_t nstripes, struct alloc *a)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, (uint8_t)k);
	kvp_w_u8(&w, (uint8_t)m);
	kvp_w_u32(&w, cs);
	kvp_w_u32(&w, nstripes);
	uint8_t *b = NULL;
	uint32_t l = 0;
	int rc = call(c, KVP_OP_ALLOC, &w, &b, &l);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, l);
	a->write_id = kvp_r_u64(&r);
	a->nstripes = nstripes;
	a->width = (uint32_t)(k + m);
	uint32_t nn = kvp_r_u32(&r);
	assert_true(nn <= NNODES);
	for (uint32_t i = 0; i < nn; i++) {
		char addr[64];
		kvp_r_u32(&r);
		kvp_r_str(&r, addr, sizeof(addr));
		assert_string_equal(addr, g_nodes.addr);
	}
	size_t slots = (size_t)nstripes * a->width;
	a->node = calloc(slots + 1, sizeof(uint32_t));
	a->chunk = calloc(slots + 1, sizeof(uint64_t));
	for (size_t i = 0; i < slots; i++) {
		a->node[i] = kvp_r_u32(&r);
		a->chunk[i] = kvp_r_u64(&r);
	}
	assert_int_equal(kvp_r_end(&r), 0);
	free(b);
	return 0;
}

void alloc_free(struct alloc *a)
{
	free(a->node);
	free(a->chunk);
}

uint32_t crc_of(uint64_t chunk)
{
	return (uint32_t)(chunk * 2654435761u);
}

/* COMMIT of a's slots (crc = crc_of(chunk)); nstripes/size/k overridable for error paths. */
int commit_(struct kvp_client *c, uint64_t parent, const char *name, const struct alloc *a, int k,
	    uint32_t cs, uint64_t size, int replace, struct kvp_attr *out)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, parent);
	kvp_w_cstr(&w, name);
	kvp_w_u32(&w, 0644);
	kvp_w_u64(&w, a->write_id);
	kvp_w_u64(&w, size);
	kvp_w_u32(&w, cs);
	kvp_w_u8(&w, (uint8_t)k);
	kvp_w_u8(&w, (uint8_t)(a->width - (uint32_t)k));
	kvp_w_u8(&w, (uint8_t)replace);
	kvp_w_u32(&w, a->nstripes);
	for (size_t i = 0; i < (size_t)a->nstripes * a->width; i++) {
		kvp_w_u32(&w, a->node[i]);
		kvp_w_u64(&w, a->chunk[i]);
		kvp_w_u32(&w, crc_of(a->chunk[i]));
	}
	uint8_t *b = NULL;
	uint32_t l = 0;
	int rc = call(c, KVP_OP_COMMIT, &w, &b, &l);
	if (!rc && out)
		attr_of(b, l, out);
	free(b);
	return rc;
}

/* LAYOUT, checked against a: same slots and crcs; every node listed with an address. */
int layout_check(struct kvp_client *c, uint64_t ino, const struct alloc *a, uint64_t size)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, ino);
	uint8_t *b = NULL;
	uint32_t l = 0;
	int rc = call(c, KVP_OP_LAYOUT, &w, &b, &l);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, l);
	assert_true(kvp_r_u64(&r) == size);
	kvp_r_u32(&r);
	uint8_t k = kvp_r_u8(&r), m = kvp_r_u8(&r);
	assert_int_equal(k + m, a->width);
	assert_int_equal(kvp_r_u32(&r), a->nstripes);
	uint32_t nn = kvp_r_u32(&r);
	for (uint32_t i = 0; i < nn; i++) {
		char addr[64];
		kvp_r_u32(&r);
		kvp_r_str(&r, addr, sizeof(addr));
		assert_string_equal(addr, g_nodes.addr);
		uint8_t st = kvp_r_u8(&r);
		assert_true(st == KVP_NODE_UP || st == KVP_NODE_DOWN);
	}
	for (size_t i = 0; i < (size_t)a->nstripes * a->width; i++) {
		assert_int_equal(kvp_r_u32(&r), a->node[i]);
		assert_true(kvp_r_u64(&r) == a->chunk[i]);
		assert_int_equal(kvp_r_u32(&r), crc_of(a->chunk[i]));
	}
	assert_int_equal(kvp_r_end(&r), 0);
	free(b);
	return 0;
}

void statfs_(struct kvp_client *c, struct statfs *s)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	uint8_t *b = NULL;
	uint32_t l = 0;
	assert_int_equal(call(c, KVP_OP_STATFS, &w, &b, &l), 0);
	struct kvp_rbuf r;
	kvp_r_init(&r, b, l);
	s->cap = kvp_r_u64(&r);
	s->used = kvp_r_u64(&r);
	s->files = kvp_r_u64(&r);
	s->dirs = kvp_r_u64(&r);
	s->k = kvp_r_u8(&r);
	s->m = kvp_r_u8(&r);
	s->cs = kvp_r_u32(&r);
	s->up = kvp_r_u32(&r);
	s->total = kvp_r_u32(&r);
	assert_int_equal(kvp_r_end(&r), 0);
	free(b);
}

/* State of node id from NODES. */
int node_state(struct kvp_client *c, uint32_t id)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	uint8_t *b = NULL;
	uint32_t l = 0;
	assert_int_equal(call(c, KVP_OP_NODES, &w, &b, &l), 0);
	struct kvp_rbuf r;
	kvp_r_init(&r, b, l);
	uint32_t n = kvp_r_u32(&r);
	int state = -1;
	for (uint32_t i = 0; i < n; i++) {
		char addr[64];
		uint32_t nid = kvp_r_u32(&r);
		kvp_r_u64(&r);
		kvp_r_str(&r, addr, sizeof(addr));
		uint8_t st = kvp_r_u8(&r);
		kvp_r_u64(&r), kvp_r_u64(&r), kvp_r_u64(&r), kvp_r_i64(&r);
		if (nid == id)
			state = st;
	}
	assert_int_equal(kvp_r_end(&r), 0);
	free(b);
	return state;
}

void wait_nodes_up(struct kvp_client *c, uint32_t want)
{
	struct statfs s;
	for (int i = 0; i < 500; i++) {
		statfs_(c, &s);
		if (s.up == want)
			return;
		sleep_ms(10);
	}
	fail_msg("%u nodes up, want %u", s.up, want);
}
