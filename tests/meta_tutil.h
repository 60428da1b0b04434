/* Test helpers for test_meta: the kvfs-meta daemon as a child process, a fake storage node
 * that records DEL requests, 12 fake nodes heartbeating from a thread, and client wrappers for
 * every meta op. cmocka asserts inside: call them from the test's thread (or accept that a
 * failure in another thread aborts the test binary). */
#ifndef KVFS_META_TUTIL_H
#define KVFS_META_TUTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvp.h"

#define NNODES 12
#define TMO    5000
#define GIB    (1ull << 30)
#define SECRET "meta-test-secret-0123456789"

extern char g_dir[256]; /* temporary directory of this run (secret, databases) */
extern struct kvp_secret g_secret;

struct daemon {
	pid_t pid;
	char addr[64];
	char db[300];
};

/* Starts $KVFS_BUILD_DIR/bin/kvfs-meta on g_dir/<db> (extra: one more flag or NULL) and waits
 * for its address file. */
void daemon_start2(struct daemon *d, const char *db, const char *node_timeout, const char *extra);
void daemon_start(struct daemon *d, const char *db, const char *node_timeout);
/* Stops with sig (SIGTERM: expects exit 0; SIGKILL: expects death by it); always reaps. */
void daemon_stop(struct daemon *d, int sig);
struct kvp_client *connect_to(const struct daemon *d);
void sleep_ms(int ms);

/* The fake node: a kvp_server handler recording the chunk ids of every DEL. */
struct dels_state {
	pthread_mutex_t mu;
	uint64_t *ids;
	size_t n, cap;
	int fail; /* answer DEL with -EIO */
};
extern struct dels_state g_dels;
int fake_node(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body);
int deleted(uint64_t id);
/* Waits up to 3 s until every one of ids[0..n-1] has been deleted on a node. */
int all_deleted(const uint64_t *ids, size_t n);

/* 12 fake nodes (uuids 1000..1011), all at the fake node's address; hb_main heartbeats them
 * every 150 ms to g_nodes.d, skipping silent ones. */
struct nodes_state {
	pthread_mutex_t mu;
	uint64_t cap[NNODES], used[NNODES];
	int silent[NNODES];
	char zone[NNODES][KVP_ZONE_MAX]; /* sent when not "" */
	uint32_t id[NNODES];
	char addr[64];
	atomic_int stop;
	atomic_uint rounds; /* hb_main's finished heartbeat rounds */
	struct daemon *d;
};
extern struct nodes_state g_nodes;
void *hb_main(void *arg);
/* Waits (up to 20 s) until a heartbeat round that started after the call has finished, so
 * what was set in g_nodes before it has reached meta; a fixed sleep did not, under load. */
void hb_wait_round(void);
int heartbeat(struct kvp_client *c, uint64_t uuid, const char *addr, uint64_t cap, uint64_t used,
	      uint32_t *id);
/* As heartbeat, with zone label zone (NULL or "": none sent). */
int heartbeat_z(struct kvp_client *c, uint64_t uuid, const char *addr, uint64_t cap, uint64_t used,
		const char *zone, uint32_t *id);
void wait_nodes_up(struct kvp_client *c, uint32_t want);

/* ---- op wrappers: return the meta's status ---- */
/* Sends w's body as op and re-initialises w for the next request. */
int call(struct kvp_client *c, uint16_t op, struct kvp_wbuf *w, uint8_t **rb, uint32_t *rl);
void attr_of(const uint8_t *b, uint32_t l, struct kvp_attr *a);
/* LOOKUP / MKDIR (mode) / RMDIR / UNLINK with a raw name of nlen bytes. */
int name_op(struct kvp_client *c, uint16_t op, uint64_t parent, const char *name, size_t nlen,
	    uint32_t mode, struct kvp_attr *a);
int mkdir_(struct kvp_client *c, uint64_t parent, const char *name, struct kvp_attr *a);
int lookup(struct kvp_client *c, uint64_t parent, const char *name, struct kvp_attr *a);
int getattr(struct kvp_client *c, uint64_t ino, struct kvp_attr *a);
int rename_(struct kvp_client *c, uint64_t p, const char *n, uint64_t np, const char *nn,
	    uint32_t flags);

struct alloc {
	uint64_t write_id;
	uint32_t nstripes, width;
	uint32_t *node;	 /* per slot */
	uint64_t *chunk; /* per slot */
};
int alloc_(struct kvp_client *c, int k, int m, uint32_t cs, uint32_t nstripes, struct alloc *a);
void alloc_free(struct alloc *a);
uint32_t crc_of(uint64_t chunk);
/* COMMIT of a's slots (crc = crc_of(chunk)); k, chunk size and size given for error paths. */
int commit_(struct kvp_client *c, uint64_t parent, const char *name, const struct alloc *a, int k,
	    uint32_t cs, uint64_t size, int replace, struct kvp_attr *out);
/* LAYOUT, checked against a: same slots and crcs; every node listed with an address. */
int layout_check(struct kvp_client *c, uint64_t ino, const struct alloc *a, uint64_t size);

struct statfs {
	uint64_t cap, used, files, dirs;
	int k, m;
	uint32_t cs, up, total;
};
void statfs_(struct kvp_client *c, struct statfs *s);
/* State of node id from NODES (-1 if not listed). */
int node_state(struct kvp_client *c, uint32_t id);

#endif
