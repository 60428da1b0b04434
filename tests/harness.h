/* harness — starts real kvfs daemons as child processes for integration tests: kvfs-meta and
 * N kvfs-node on loopback, each with its own directory under one state dir, on ephemeral ports
 * that stay the same across restarts (so clients and nodes reconnect to the same address).
 *
 * Processes are stopped only by PID. Daemon logs go to <dir>/<name>.log. Binaries come from
 * $KVFS_BUILD_DIR/bin (set by CTest) or ./bin. Not thread-safe; one cluster per test process
 * is typical but several work.
 */
#ifndef KVFS_TEST_HARNESS_H
#define KVFS_TEST_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "kvp.h"

#define KVH_MAX_NODES 32

struct kvh_node {
	pid_t pid; /* 0 when not running */
	char addr[KVP_ADDR_MAX];
	char dir[512];
	char args[512];		    /* extra arguments it was started with */
	char metrics[KVP_ADDR_MAX]; /* HOST:PORT of its /metrics (KVH_METRICS), else "" */
	char ns[32];		    /* network namespace it runs in ("": the caller's) */
	char ip[32];		    /* address it listens on ("": 127.0.0.1) */
};

struct kvh_cluster {
	char dir[256];
	char secret_file[512];
	struct kvp_secret secret;
	char meta_addr[KVP_ADDR_MAX];
	char meta_db[512];
	char meta_args[512];
	pid_t meta_pid;
	char meta_metrics[KVP_ADDR_MAX]; /* HOST:PORT of meta's /metrics (KVH_METRICS), else "" */
	unsigned flags;			 /* KVH_* given to kvh_cluster_start_flags */
	char meta_ns[32], meta_ip[32];	 /* as kvh_node's ns and ip */
	int nnodes;
	struct kvh_node nodes[KVH_MAX_NODES];
};

/* Path of a built binary ("kvfs-meta"); a static buffer per call site is not needed: the
 * result is written into out (cap bytes). */
int kvh_bin(const char *name, char *out, size_t cap);

/* Starts meta and nnodes nodes, waits until meta lists all of them up. meta_args and node_args
 * are extra flags split on spaces (may be NULL), e.g. "--node-timeout 2s" or "--capacity 64M".
 * Returns 0 or a negative errno (the daemons' logs say why). */
int kvh_cluster_start(struct kvh_cluster *cl, int nnodes, const char *meta_args,
		      const char *node_args);
/* KVH_METRICS: every daemon also serves /metrics on an ephemeral port (--metrics-listen) of
 * its listen address, its address in cl->meta_metrics / node.metrics (new after each
 * restart). */
#define KVH_METRICS 1u
int kvh_cluster_start_flags(struct kvh_cluster *cl, int nnodes, const char *meta_args,
			    const char *node_args, unsigned flags);
/* Where each daemon runs (tests/netns_tutil.h builds the namespaces): meta in namespace
 * meta_ns listening on meta_ip, node i in node_ns[i] on node_ip[i] with node_args[i] appended
 * to node_args (each may be NULL / "": the caller's namespace, 127.0.0.1, nothing). Daemons
 * are started through `ip netns exec NS`, which execs in place: the pid is the daemon's. */
struct kvh_hosts {
	const char *meta_ns, *meta_ip;
	const char *node_ns[KVH_MAX_NODES], *node_ip[KVH_MAX_NODES];
	const char *node_args[KVH_MAX_NODES];
};
int kvh_cluster_start_hosts(struct kvh_cluster *cl, int nnodes, const char *meta_args,
			    const char *node_args, unsigned flags, const struct kvh_hosts *h);
/* Sends SIGTERM to every process, SIGKILL after 5 s, reaps them, removes the state dir. */
void kvh_cluster_stop(struct kvh_cluster *cl);

/* Signals (e.g. SIGKILL) and reaps; the process can be restarted on the same dir and port. */
int kvh_meta_kill(struct kvh_cluster *cl, int sig);
int kvh_meta_restart(struct kvh_cluster *cl);
int kvh_node_kill(struct kvh_cluster *cl, int i, int sig);
int kvh_node_restart(struct kvh_cluster *cl, int i);
/* Adds one more node (new dir) with extra args; returns its index. */
int kvh_node_add(struct kvh_cluster *cl, const char *node_args);

/* Waits until meta reports exactly `up` nodes up. */
int kvh_wait_nodes_up(struct kvh_cluster *cl, int up, int timeout_ms);

/* Generic: starts bin with argv (argv[0] included, NULL-terminated), stdout+stderr to logfile.
 * The child is killed when the calling thread ends (PR_SET_PDEATHSIG), so a crashed or failed
 * test leaves no daemons: start processes from the test's main thread.
 * Returns the pid or a negative errno. */
pid_t kvh_spawn(const char *bin, char *const argv[], const char *logfile);
/* Signals pid, waits up to timeout_ms for it to exit (SIGKILL after), reaps it. */
int kvh_stop_pid(pid_t pid, int sig, int timeout_ms);
/* Polls for a file to exist and be non-empty; reads its first line (newline stripped). */
int kvh_wait_file(const char *path, int timeout_ms, char *buf, size_t cap);

/* 1 when FUSE mounts can work here (/dev/fuse openable and fusermount3 present). */
int kvh_have_fuse(void);

/* Runs a shell command, returns its exit status (or -1). */
int kvh_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A group of loopback kvfs-meta replicas (test_raft, test_raft_redirect). */
#define KVH_RAFT_MAX 5
struct kvh_raft {
	char dir[256], secret[600];
	char meta[KVH_RAFT_MAX][64], raft[KVH_RAFT_MAX][64]; /* client, Raft addresses */
	char peers[512];				     /* the --raft-peers list */
	struct kvp_secret sec;
	int n;
};
/* A loopback port that binds now, below the ephemeral range: one from inside it could be
 * taken by an outgoing connection (Raft's own) before a replica binds it. 0 on failure. */
uint16_t kvh_free_port(void);
/* Fills g for n replicas: a fresh directory from tmpl ("/tmp/NAME-XXXXXX"), a secret file in
 * it (loaded into g->sec), two free ports per replica, the peers list. Starts nothing.
 * 0, -EINVAL (n out of range), or a negative errno. */
int kvh_raft_init(struct kvh_raft *g, const char *tmpl, int n);
/* Starts replica i (0-based; Raft id i + 1; 2+1 coding; its db, Raft dir and log under
 * g->dir) with the flags every test gives plus extra (NULL-terminated, may be NULL).
 * Returns the pid or a negative errno. */
pid_t kvh_raft_spawn(const struct kvh_raft *g, int i, const char *const *extra);
/* Starts kvfs-node i (its dir and log under g->dir: node<i>, node<i>.log; g's secret, 0.2 s
 * heartbeats) reporting to meta (one replica's client address, or a comma list). Returns the
 * pid or a negative errno. */
pid_t kvh_raft_node_spawn(const struct kvh_raft *g, int i, const char *meta);
/* Replica i's RSTATUS through pool (1 s), parsed into s: 0 or a negative errno. */
int kvh_raft_rstatus(struct kvp_pool *pool, const struct kvh_raft *g, int i, struct kvp_rstatus *s);
/* Replica i's RSTATUS through pool (1 s): 0 with its state (3 leader), whether it serves and,
 * unless applied is NULL, its applied index; or a negative errno. */
int kvh_raft_status(struct kvp_pool *pool, const struct kvh_raft *g, int i, int *state,
		    int *serving, uint64_t *applied);
/* The first replica of g that answers as a serving leader, polling every 50 ms for up to
 * timeout_ms: only replicas with pids[i] > 0 (pids may be NULL: all) other than skip (-1:
 * none). Its index, or -1 if none did. */
int kvh_raft_leader(struct kvp_pool *pool, const struct kvh_raft *g, const pid_t *pids, int skip,
		    int timeout_ms);

#endif
