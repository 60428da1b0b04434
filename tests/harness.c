#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

int kvh_bin(const char *name, char *out, size_t cap)
{
	const char *b = getenv("KVFS_BUILD_DIR");
	int n = snprintf(out, cap, "%s/bin/%s", b ? b : ".", name);
	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	return access(out, X_OK) == 0 ? 0 : -ENOENT;
}

pid_t kvh_spawn(const char *bin, char *const argv[], const char *logfile)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		/* A test that dies (a failed assert, a crash) must not leave daemons behind: they
		 * get SIGKILL when the thread that started them ends. Spawn from the test's main
		 * thread. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int fd = open(logfile ? logfile : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		int nul = open("/dev/null", O_RDONLY);
		if (nul >= 0) {
			dup2(nul, 0);
			close(nul);
		}
		execv(bin, argv);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	return pid;
}

int kvh_stop_pid(pid_t pid, int sig, int timeout_ms)
{
	if (pid <= 0)
		return 0;
	kill(pid, sig);
	long end = now_ms() + timeout_ms;
	int st;
	while (now_ms() < end) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid || (r < 0 && errno == ECHILD))
			return 0;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -ETIMEDOUT;
}

int kvh_wait_file(const char *path, int timeout_ms, char *buf, size_t cap)
{
	long end = now_ms() + timeout_ms;
	do {
		FILE *f = fopen(path, "r");
		if (f) {
			char *ok = fgets(buf, (int)cap, f);
			fclose(f);
			if (ok && *buf) {
				buf[strcspn(buf, "\r\n")] = 0;
				return 0;
			}
		}
		usleep(10000);
	} while (now_ms() < end);
	return -ETIMEDOUT;
}

/* Splits extra args on spaces into argv[*n...]; keeps a copy in store. */
static void add_args(char **argv, int *n, int max, char *store, size_t cap, const char *extra)
{
	if (!extra || !*extra)
		return;
	snprintf(store, cap, "%s", extra);
	for (char *save, *t = strtok_r(store, " ", &save); t && *n < max - 1;
	     t = strtok_r(NULL, " ", &save))
		argv[(*n)++] = t;
}

/* Spawns bin with argv in namespace ns ("" = ours): `ip netns exec NS bin args...`. */
static pid_t spawn_in(const char *ns, const char *bin, char **argv, const char *log)
{
	if (!ns[0])
		return kvh_spawn(bin, argv, log);
	char *v[64];
	int n = 0;
	v[n++] = "ip";
	v[n++] = "netns";
	v[n++] = "exec";
	v[n++] = (char *)ns;
	v[n++] = (char *)bin;
	for (int i = 1; argv[i] && n < 63; i++)
		v[n++] = argv[i];
	v[n] = NULL;
	const char *ip = access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip";
	return kvh_spawn(ip, v, log);
}

/* "IP:0" for a daemon's first start on ip ("" = 127.0.0.1). */
static const char *any_port(const char *ip, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s:0", ip[0] ? ip : "127.0.0.1");
	return buf;
}

static int start_meta(struct kvh_cluster *cl, const char *listen)
{
	char bin[600], log[600], addrfile[600], scratch[512];
	if (kvh_bin("kvfs-meta", bin, sizeof(bin)))
		return -ENOENT;
	snprintf(log, sizeof(log), "%s/meta.log", cl->dir);
	snprintf(addrfile, sizeof(addrfile), "%s/meta.addr", cl->dir);
	unlink(addrfile);
	char *argv[48] = {
	    "kvfs-meta", "--db",	 cl->meta_db,	"--secret-file", cl->secret_file,
	    "--listen",	 (char *)listen, "--addr-file", addrfile,	 "--log-level",
	    "2"};
	int n = 11;
	char mfile[600];
	snprintf(mfile, sizeof(mfile), "%s/meta.metrics", cl->dir);
	char mlisten[48];
	if (cl->flags & KVH_METRICS) {
		unlink(mfile);
		argv[n++] = "--metrics-listen";
		argv[n++] = (char *)any_port(cl->meta_ip, mlisten, sizeof(mlisten));
		argv[n++] = "--metrics-addr-file";
		argv[n++] = mfile;
	}
	add_args(argv, &n, 48, scratch, sizeof(scratch), cl->meta_args);
	argv[n] = NULL;
	pid_t pid = spawn_in(cl->meta_ns, bin, argv, log);
	if (pid < 0)
		return pid;
	cl->meta_pid = pid;
	int rc = kvh_wait_file(addrfile, 10000, cl->meta_addr, sizeof(cl->meta_addr));
	if (!rc && (cl->flags & KVH_METRICS))
		rc = kvh_wait_file(mfile, 10000, cl->meta_metrics, sizeof(cl->meta_metrics));
	return rc;
}

static int start_node(struct kvh_cluster *cl, int i, const char *listen)
{
	struct kvh_node *nd = &cl->nodes[i];
	char bin[600], log[600], addrfile[600], scratch[512];
	if (kvh_bin("kvfs-node", bin, sizeof(bin)))
		return -ENOENT;
	snprintf(log, sizeof(log), "%s/node%d.log", cl->dir, i);
	snprintf(addrfile, sizeof(addrfile), "%s/node%d.addr", cl->dir, i);
	unlink(addrfile);
	char *argv[48] = {"kvfs-node", "--dir",	      nd->dir,	  "--secret-file", cl->secret_file,
			  "--meta",    cl->meta_addr, "--listen", (char *)listen,  "--addr-file",
			  addrfile,    "--heartbeat", "0.2s",	  "--log-level",   "2"};
	int n = 15;
	char mfile[600];
	snprintf(mfile, sizeof(mfile), "%s/node%d.metrics", cl->dir, i);
	char mlisten[48];
	if (cl->flags & KVH_METRICS) {
		unlink(mfile);
		argv[n++] = "--metrics-listen";
		argv[n++] = (char *)any_port(nd->ip, mlisten, sizeof(mlisten));
		argv[n++] = "--metrics-addr-file";
		argv[n++] = mfile;
	}
	add_args(argv, &n, 48, scratch, sizeof(scratch), nd->args);
	argv[n] = NULL;
	pid_t pid = spawn_in(nd->ns, bin, argv, log);
	if (pid < 0)
		return pid;
	nd->pid = pid;
	int rc = kvh_wait_file(addrfile, 10000, nd->addr, sizeof(nd->addr));
	if (!rc && (cl->flags & KVH_METRICS))
		rc = kvh_wait_file(mfile, 10000, nd->metrics, sizeof(nd->metrics));
	return rc;
}

/* NODES reply: u32 n, n x (u32 id, u64 uuid, str addr, u8 state, u64 cap, u64 used,
 * u64 chunks, i64 heartbeat_ns). Returns the number of nodes up. */
static int count_up(struct kvh_cluster *cl)
{
	struct kvp_client *c;
	if (kvp_client_open(cl->meta_addr, &cl->secret, 1000, &c))
		return -1;
	uint8_t *b = NULL;
	uint32_t len = 0;
	int up = -1;
	if (kvp_call(c, KVP_OP_NODES, NULL, 0, NULL, 0, 2000, &b, &len) == 0) {
		struct kvp_rbuf r;
		kvp_r_init(&r, b, len);
		uint32_t n = kvp_r_u32(&r);
		up = 0;
		for (uint32_t i = 0; i < n && !r.err; i++) {
			char addr[KVP_ADDR_MAX];
			kvp_r_u32(&r), kvp_r_u64(&r);
			kvp_r_str(&r, addr, sizeof(addr));
			if (kvp_r_u8(&r) == KVP_NODE_UP)
				up++;
			kvp_r_u64(&r), kvp_r_u64(&r), kvp_r_u64(&r), kvp_r_i64(&r);
		}
		if (kvp_r_end(&r))
			up = -1;
	}
	free(b);
	kvp_client_close(c);
	return up;
}

int kvh_wait_nodes_up(struct kvh_cluster *cl, int up, int timeout_ms)
{
	long end = now_ms() + timeout_ms;
	do {
		if (count_up(cl) == up)
			return 0;
		usleep(50000);
	} while (now_ms() < end);
	return -ETIMEDOUT;
}

int kvh_cluster_start(struct kvh_cluster *cl, int nnodes, const char *meta_args,
		      const char *node_args)
{
	return kvh_cluster_start_flags(cl, nnodes, meta_args, node_args, 0);
}

int kvh_cluster_start_flags(struct kvh_cluster *cl, int nnodes, const char *meta_args,
			    const char *node_args, unsigned flags)
{
	return kvh_cluster_start_hosts(cl, nnodes, meta_args, node_args, flags, NULL);
}

#define HSTR(x) ((x) ? (x) : "")

int kvh_cluster_start_hosts(struct kvh_cluster *cl, int nnodes, const char *meta_args,
			    const char *node_args, unsigned flags, const struct kvh_hosts *h)
{
	memset(cl, 0, sizeof(*cl));
	cl->flags = flags;
	if (nnodes > KVH_MAX_NODES)
		return -EINVAL;
	if (h) {
		snprintf(cl->meta_ns, sizeof(cl->meta_ns), "%s", HSTR(h->meta_ns));
		snprintf(cl->meta_ip, sizeof(cl->meta_ip), "%s", HSTR(h->meta_ip));
		for (int i = 0; i < nnodes; i++) {
			snprintf(cl->nodes[i].ns, sizeof(cl->nodes[i].ns), "%s",
				 HSTR(h->node_ns[i]));
			snprintf(cl->nodes[i].ip, sizeof(cl->nodes[i].ip), "%s",
				 HSTR(h->node_ip[i]));
		}
	}
	snprintf(cl->dir, sizeof(cl->dir), "/tmp/kvfs-test-XXXXXX");
	if (!mkdtemp(cl->dir))
		return -errno;
	snprintf(cl->secret_file, sizeof(cl->secret_file), "%s/secret", cl->dir);
	FILE *f = fopen(cl->secret_file, "w");
	if (!f)
		return -errno;
	fprintf(f, "test-secret-%ld-%d\n", (long)time(NULL), getpid());
	fclose(f);
	chmod(cl->secret_file, 0600);
	int rc = kvp_secret_load(cl->secret_file, &cl->secret);
	if (rc)
		return rc;
	snprintf(cl->meta_db, sizeof(cl->meta_db), "%s/meta", cl->dir);
	snprintf(cl->meta_args, sizeof(cl->meta_args), "%s", meta_args ? meta_args : "");
	char any[48];
	if ((rc = start_meta(cl, any_port(cl->meta_ip, any, sizeof(any)))))
		return rc;
	for (int i = 0; i < nnodes; i++) {
		char dir[sizeof(cl->nodes[i].dir)];
		snprintf(dir, sizeof(dir), "%.256s/node%d", cl->dir, i);
		memcpy(cl->nodes[i].dir, dir, sizeof(dir));
		snprintf(cl->nodes[i].args, sizeof(cl->nodes[i].args), "%s%s%s",
			 node_args ? node_args : "", h && h->node_args[i] ? " " : "",
			 h ? HSTR(h->node_args[i]) : "");
		cl->nnodes = i + 1;
		if ((rc = start_node(cl, i, any_port(cl->nodes[i].ip, any, sizeof(any)))))
			return rc;
	}
	return kvh_wait_nodes_up(cl, nnodes, 15000);
}

void kvh_cluster_stop(struct kvh_cluster *cl)
{
	for (int i = 0; i < cl->nnodes; i++)
		if (cl->nodes[i].pid > 0)
			kill(cl->nodes[i].pid, SIGTERM);
	for (int i = 0; i < cl->nnodes; i++) {
		kvh_stop_pid(cl->nodes[i].pid, SIGTERM, 5000);
		cl->nodes[i].pid = 0;
	}
	kvh_stop_pid(cl->meta_pid, SIGTERM, 5000);
	cl->meta_pid = 0;
	if (cl->dir[0] && !getenv("KVFS_KEEP_TEST_DIR"))
		kvh_sh("rm -rf '%s'", cl->dir);
}

int kvh_meta_kill(struct kvh_cluster *cl, int sig)
{
	int rc = kvh_stop_pid(cl->meta_pid, sig, 5000);
	cl->meta_pid = 0;
	return rc;
}

int kvh_meta_restart(struct kvh_cluster *cl)
{
	char listen[KVP_ADDR_MAX];
	snprintf(listen, sizeof(listen), "%s", cl->meta_addr);
	/* The old port may linger briefly after a kill; retry for a while. */
	int rc = -EADDRINUSE;
	for (int i = 0; i < 50 && rc; i++) {
		rc = start_meta(cl, listen);
		if (rc) {
			kvh_stop_pid(cl->meta_pid, SIGKILL, 1000);
			cl->meta_pid = 0;
			snprintf(cl->meta_addr, sizeof(cl->meta_addr), "%s", listen);
			usleep(100000);
		}
	}
	return rc;
}

int kvh_node_kill(struct kvh_cluster *cl, int i, int sig)
{
	int rc = kvh_stop_pid(cl->nodes[i].pid, sig, 5000);
	cl->nodes[i].pid = 0;
	return rc;
}

int kvh_node_restart(struct kvh_cluster *cl, int i)
{
	char listen[KVP_ADDR_MAX];
	snprintf(listen, sizeof(listen), "%s", cl->nodes[i].addr);
	int rc = -EADDRINUSE;
	for (int t = 0; t < 50 && rc; t++) {
		rc = start_node(cl, i, listen);
		if (rc) {
			kvh_stop_pid(cl->nodes[i].pid, SIGKILL, 1000);
			cl->nodes[i].pid = 0;
			snprintf(cl->nodes[i].addr, sizeof(cl->nodes[i].addr), "%s", listen);
			usleep(100000);
		}
	}
	return rc;
}

int kvh_node_add(struct kvh_cluster *cl, const char *node_args)
{
	if (cl->nnodes >= KVH_MAX_NODES)
		return -ENOSPC;
	int i = cl->nnodes++;
	char dir[sizeof(cl->nodes[i].dir)];
	snprintf(dir, sizeof(dir), "%.256s/node%d", cl->dir, i);
	memcpy(cl->nodes[i].dir, dir, sizeof(dir));
	snprintf(cl->nodes[i].args, sizeof(cl->nodes[i].args), "%s", node_args ? node_args : "");
	int rc = start_node(cl, i, "127.0.0.1:0");
	return rc ? rc : i;
}

int kvh_have_fuse(void)
{
	int fd = open("/dev/fuse", O_RDWR);
	if (fd < 0)
		return 0;
	close(fd);
	return kvh_sh("command -v fusermount3 >/dev/null 2>&1") == 0;
}

int kvh_sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int st = system(cmd);
	if (st == -1 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

uint16_t kvh_free_port(void)
{
	for (int tries = 0; tries < 1000; tries++) {
		uint16_t p = (uint16_t)(20000 + random() % 12000);
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0)
			return 0;
		struct sockaddr_in a = {.sin_family = AF_INET,
					.sin_port = htons(p),
					.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		int ok = bind(s, (struct sockaddr *)&a, sizeof(a)) == 0;
		close(s);
		if (ok)
			return p;
	}
	return 0;
}

int kvh_raft_init(struct kvh_raft *g, const char *tmpl, int n)
{
	if (n < 1 || n > KVH_RAFT_MAX || strlen(tmpl) >= sizeof(g->dir))
		return -EINVAL;
	memset(g, 0, sizeof(*g));
	g->n = n;
	snprintf(g->dir, sizeof(g->dir), "%s", tmpl);
	if (!mkdtemp(g->dir))
		return -errno;
	snprintf(g->secret, sizeof(g->secret), "%s/secret", g->dir);
	if (kvh_sh("head -c 24 /dev/urandom | base64 > %s && chmod 600 %s", g->secret, g->secret) !=
	    0)
		return -EIO;
	int rc = kvp_secret_load(g->secret, &g->sec);
	if (rc)
		return rc;
	size_t pl = 0;
	for (int i = 0; i < n; i++) {
		uint16_t mp = kvh_free_port(), rp = kvh_free_port();
		if (!mp || !rp)
			return -EADDRINUSE;
		snprintf(g->meta[i], sizeof(g->meta[i]), "127.0.0.1:%u", mp);
		snprintf(g->raft[i], sizeof(g->raft[i]), "127.0.0.1:%u", rp);
		pl += (size_t)snprintf(g->peers + pl, sizeof(g->peers) - pl, "%s%d=%s",
				       i ? "," : "", i + 1, g->raft[i]);
		if (pl >= sizeof(g->peers))
			return -ENAMETOOLONG;
	}
	return 0;
}

pid_t kvh_raft_node_spawn(const struct kvh_raft *g, int i, const char *meta)
{
	char bin[600], dir[400], log[400];
	int rc = kvh_bin("kvfs-node", bin, sizeof(bin));
	if (rc)
		return rc;
	snprintf(dir, sizeof(dir), "%s/node%d", g->dir, i);
	snprintf(log, sizeof(log), "%s/node%d.log", g->dir, i);
	char *argv[] = {bin,	  "--dir",	dir,	       "--secret-file", (char *)g->secret,
			"--meta", (char *)meta, "--heartbeat", "0.2s",		NULL};
	return kvh_spawn(bin, argv, log);
}

int kvh_raft_rstatus(struct kvp_pool *pool, const struct kvh_raft *g, int i, struct kvp_rstatus *s)
{
	memset(s, 0, sizeof(*s));
	struct kvp_client *cl;
	int rc = kvp_pool_get(pool, g->meta[i], &cl);
	if (rc)
		return rc;
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	rc = kvp_call(cl, KVP_OP_RSTATUS, NULL, 0, NULL, 0, 1000, &rb, &rl);
	kvp_pool_put(pool, cl);
	if (rc)
		return rc;
	rc = kvp_rstatus_parse(rb, rl, s);
	free(rb);
	return rc;
}

int kvh_raft_status(struct kvp_pool *pool, const struct kvh_raft *g, int i, int *state,
		    int *serving, uint64_t *applied)
{
	struct kvp_rstatus s;
	int rc = kvh_raft_rstatus(pool, g, i, &s);
	if (rc)
		return rc;
	*state = s.state;
	*serving = s.serving;
	if (applied)
		*applied = s.applied;
	return 0;
}

int kvh_raft_leader(struct kvp_pool *pool, const struct kvh_raft *g, const pid_t *pids, int skip,
		    int timeout_ms)
{
	for (int t = 0; t < timeout_ms / 50; t++) {
		for (int i = 0; i < g->n; i++) {
			int st, sv;
			if (i != skip && (!pids || pids[i] > 0) &&
			    kvh_raft_status(pool, g, i, &st, &sv, NULL) == 0 && st == 3 && sv)
				return i;
		}
		usleep(50000);
	}
	return -1;
}

pid_t kvh_raft_spawn(const struct kvh_raft *g, int i, const char *const *extra)
{
	char bin[600], db[400], rdir[400], log[400], id[16];
	if (i < 0 || i >= g->n)
		return -EINVAL;
	int rc = kvh_bin("kvfs-meta", bin, sizeof(bin));
	if (rc)
		return rc;
	snprintf(db, sizeof(db), "%s/meta%d", g->dir, i + 1);
	snprintf(rdir, sizeof(rdir), "%s/raft%d", g->dir, i + 1);
	snprintf(log, sizeof(log), "%s/meta%d.log", g->dir, i + 1);
	snprintf(id, sizeof(id), "%d", i + 1);
	const char *base[] = {
	    bin,	"--db",		db,	  "--secret-file", g->secret, "--listen",
	    g->meta[i], "--k",		"2",	  "--m",	   "1",	      "--raft-id",
	    id,		"--raft-peers", g->peers, "--raft-dir",	   rdir};
	enum { NBASE = sizeof(base) / sizeof(base[0]), NEXTRA = 16 };
	char *argv[NBASE + NEXTRA + 1];
	int n = 0;
	for (; n < (int)NBASE; n++)
		argv[n] = (char *)base[n];
	for (int j = 0; extra && extra[j]; j++) {
		if (j == NEXTRA)
			return -E2BIG;
		argv[n++] = (char *)extra[j];
	}
	argv[n] = NULL;
	return kvh_spawn(bin, argv, log);
}
