/* netns_tutil — namespaces, veth pairs, a bridge and tc shaping for cross-host tests. */
#include "netns_tutil.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "link_delay.h"

/* The network the atexit hook removes; one per process is all the tests need. */
static struct kvn_net *g_live;

/* Runs a shell command; its output only with KVFS_TEST_VERBOSE. Returns its exit status. */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(cmd + 2, sizeof(cmd) - 32, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(cmd) - 32)
		return -ENAMETOOLONG;
	memcpy(cmd, "{ ", 2); /* the redirection covers every command of a && chain */
	if (!getenv("KVFS_TEST_VERBOSE"))
		strcat(cmd, "; } >/dev/null 2>&1");
	else {
		strcat(cmd, "; }");
		fprintf(stderr, "netns: %s\n", cmd);
	}
	int st = system(cmd);
	return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

/* Deletes namespaces "kvn<pid>-*" of runs whose process is gone. */
static void sweep_stale(void)
{
	DIR *d = opendir("/run/netns");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		int pid = 0, len = 0;
		if (sscanf(e->d_name, "kvn%d-%n", &pid, &len) != 1 || len == 0 || pid <= 0)
			continue;
		if (kill(pid, 0) == 0 || errno != ESRCH)
			continue; /* alive (or not ours to judge) */
		run("ip netns del '%s'", e->d_name);
	}
	closedir(d);
}

int kvn_probe(char *why, size_t cap)
{
	char ns[32];
	snprintf(ns, sizeof(ns), "kvn%d-probe", (int)getpid());
	if (geteuid() != 0) {
		snprintf(why, cap, "network namespaces need root (CAP_NET_ADMIN)");
		return -EPERM;
	}
	if (run("ip -V") != 0) {
		snprintf(why, cap, "no iproute2 `ip` (tools/install-deps.sh installs it)");
		return -ENOENT;
	}
	if (run("ip netns add %s", ns) != 0) {
		snprintf(why, cap, "`ip netns add` fails here (no CAP_SYS_ADMIN or no netns)");
		return -EPERM;
	}
	int rc = 0;
	if (run("ip -n %s link add b0 type bridge && ip -n %s link add v0 type veth peer name v1",
		ns, ns) != 0) {
		snprintf(why, cap, "no bridge or veth support in this kernel");
		rc = -EOPNOTSUPP;
	}
	run("ip netns del %s", ns);
	return rc;
}

/* A tc rate ("10gbit", "5mbit", ...) in bits per second; NULL: 0 (unlimited). */
static double rate_bps(const char *rate)
{
	if (!rate)
		return 0;
	char *end;
	double bps = strtod(rate, &end);
	return bps * (strncmp(end, "gbit", 4) == 0   ? 1e9
		      : strncmp(end, "mbit", 4) == 0 ? 1e6
		      : strncmp(end, "kbit", 4) == 0 ? 1e3
						     : 1);
}

/* One direction of a link: netem (delay, optional rate) or tbf (rate); none removes it. */
static int shape_dev(const struct kvn_net *net, const char *ns, const char *dev, double delay_ms,
		     const char *rate)
{
	run("ip netns exec %s tc qdisc del dev %s root", ns, dev); /* may have none */
	if (delay_ms > 0 || (rate && net->have_netem)) {
		if (!net->have_netem)
			return -EOPNOTSUPP;
		char r[64] = "";
		if (rate)
			snprintf(r, sizeof(r), " rate %s", rate);
		return run("ip netns exec %s tc qdisc add dev %s root netem delay %.3fms%s limit "
			   "100000",
			   ns, dev, delay_ms, r)
			   ? -EIO
			   : 0;
	}
	if (!rate)
		return 0;
	/* burst: 10 ms at the rate (at least rate / HZ, or tbf cannot reach it; no more, or a
	 * slow link would pass whole chunks at full speed), 16 KiB at least. */
	double bps = rate_bps(rate);
	long burst = (long)(bps / 8 / 100);
	burst = burst < 16384 ? 16384 : burst;
	return run("ip netns exec %s tc qdisc add dev %s root tbf rate %s burst %ld latency 2s", ns,
		   dev, rate, burst)
		   ? -EIO
		   : 0;
}

/* Takes host i's TAP delayer off its path: its port back on the switch, the thread stopped
 * (the TAP devices go with their fds), its bridge deleted. */
static void delay_off(struct kvn_net *net, int i)
{
	if (!net->delay[i])
		return;
	run("ip -n %s link set p%d master br0", net->sw, i);
	lkd_stop(net->delay[i]);
	net->delay[i] = NULL;
	run("ip -n %s link del dl%d", net->sw, i);
}

/* Opens TAP devices a and b in namespace ns (the calling thread returns to its own). */
static int taps_open(const char *ns, const char *a, const char *b, int *fa, int *fb)
{
	char path[64];
	snprintf(path, sizeof(path), "/run/netns/%s", ns);
	int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	int there = open(path, O_RDONLY | O_CLOEXEC);
	int rc = self < 0 || there < 0 ? -errno : 0;
	if (!rc && setns(there, CLONE_NEWNET))
		rc = -errno;
	else if (!rc) {
		*fa = *fb = -1;
		rc = lkd_tap_open(a, fa);
		if (!rc)
			rc = lkd_tap_open(b, fb);
		if (setns(self, CLONE_NEWNET)) /* cannot happen: our own namespace */
			abort();
		if (rc && *fa >= 0)
			close(*fa);
	}
	if (self >= 0)
		close(self);
	if (there >= 0)
		close(there);
	return rc;
}

/* Puts a TAP delayer on host i's path: p<i> leaves the switch for a bridge dl<i> of its own
 * with TAP da<i>; TAP db<i> joins the switch; the thread carries frames da<i> <-> db<i>. */
static int delay_on(struct kvn_net *net, int i, double delay_ms, const char *rate)
{
	char a[16], b[16];
	int fa, fb;
	snprintf(a, sizeof(a), "da%d", i);
	snprintf(b, sizeof(b), "db%d", i);
	int rc = taps_open(net->sw, a, b, &fa, &fb);
	if (rc)
		return rc;
	if ((rc = lkd_start(fa, fb, delay_ms, rate_bps(rate), &net->delay[i])))
		return rc;
	const char *s = net->sw;
	if (run("ip -n %s link add dl%d type bridge && ip -n %s link set dl%d up && "
		"ip -n %s link set %s master dl%d && ip -n %s link set %s up && "
		"ip -n %s link set %s master br0 && ip -n %s link set %s up && "
		"ip -n %s link set p%d master dl%d",
		s, i, s, i, s, a, i, s, a, s, b, s, b, s, i, i)) {
		delay_off(net, i);
		return -EIO;
	}
	return 0;
}

int kvn_shape(struct kvn_net *net, int i, double delay_ms, const char *rate)
{
	if (i < 0 || i >= net->nhosts)
		return -EINVAL;
	if (delay_ms > 0 && !net->have_delay)
		return -EOPNOTSUPP;
	char port[16];
	snprintf(port, sizeof(port), "p%d", i);
	int tap = delay_ms > 0 && !net->have_netem;
	delay_off(net, i);
	/* The TAP delayer does the rate itself: no qdisc then. */
	int rc = shape_dev(net, net->ns[i], "eth0", tap ? 0 : delay_ms,
			   tap ? NULL : rate); /* host -> switch */
	if (!rc)
		rc = shape_dev(net, net->sw, port, tap ? 0 : delay_ms,
			       tap ? NULL : rate); /* switch -> host */
	if (!rc && tap)
		rc = delay_on(net, i, delay_ms, rate);
	return rc;
}

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int kvn_rtt_ms(struct kvn_net *net, int i, double *ms)
{
	if (i < 0 || i >= net->nhosts)
		return -EINVAL;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(1)};
	if (inet_pton(AF_INET, net->ip[i], &sa.sin_addr) != 1)
		return -EINVAL;
	double best = -1;
	for (int t = 0; t < 3; t++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		int64_t t0 = mono_ns();
		int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
		if (rc == -EINPROGRESS) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			int e = 0;
			socklen_t el = sizeof(e);
			rc = poll(&p, 1, 5000);
			if (rc == 0)
				rc = -ETIMEDOUT;
			else if (rc > 0)
				rc = getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) ? -errno : -e;
			else
				rc = -errno;
		}
		double took = (double)(mono_ns() - t0) / 1e6;
		close(fd);
		if (rc != -ECONNREFUSED) /* a listener on port 1 (0), or no answer */
			return rc ? rc : -EADDRINUSE;
		best = best < 0 || took < best ? took : best;
	}
	*ms = best;
	return 0;
}

int kvn_link(struct kvn_net *net, int i, int up)
{
	if (i < 0 || i >= net->nhosts)
		return -EINVAL;
	return run("ip -n %s link set p%d %s", net->sw, i, up ? "up" : "down") ? -EIO : 0;
}

int kvn_cut(struct kvn_net *net, int i, int j, int cut)
{
	if (i < 0 || i >= net->nhosts || j < 0 || j >= net->nhosts || i == j)
		return -EINVAL;
	const char *verb = cut ? "add" : "del";
	/* Both ends: a route in one alone would still let the other's packets in. */
	if (run("ip -n %s route %s blackhole %s/32", net->ns[i], verb, net->ip[j]) ||
	    run("ip -n %s route %s blackhole %s/32", net->ns[j], verb, net->ip[i]))
		return -EIO;
	return 0;
}

int kvn_enter(struct kvn_net *net, int i)
{
	if (i < 0 || i >= net->nhosts)
		return -EINVAL;
	char path[64];
	snprintf(path, sizeof(path), "/run/netns/%s", net->ns[i]);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = setns(fd, CLONE_NEWNET) ? -errno : 0;
	close(fd);
	return rc;
}

void kvn_net_destroy(struct kvn_net *net)
{
	if (!net || !net->prefix[0])
		return;
	for (int i = 0; i < net->nhosts; i++) { /* threads first; the devices go with the ns */
		lkd_stop(net->delay[i]);
		net->delay[i] = NULL;
	}
	for (int i = 0; i < net->nhosts; i++)
		if (net->ns[i][0])
			run("ip netns del %s", net->ns[i]);
	/* Deleting the switch namespace deletes the bridge and every veth pair with it. */
	if (net->sw[0])
		run("ip netns del %s", net->sw);
	if (g_live == net)
		g_live = NULL;
	net->prefix[0] = 0;
}

static void at_exit(void)
{
	kvn_net_destroy(g_live);
}

int kvn_net_create(struct kvn_net *net, int nhosts, double delay_ms, const char *rate)
{
	static int hooked;
	memset(net, 0, sizeof(*net));
	if (nhosts < 1 || nhosts > KVN_MAX_HOSTS || g_live)
		return -EINVAL;
	sweep_stale();
	if (!hooked && atexit(at_exit) == 0)
		hooked = 1;
	snprintf(net->prefix, sizeof(net->prefix), "kvn%d", (int)getpid());
	snprintf(net->sw, sizeof(net->sw), "%s-sw", net->prefix);
	g_live = net;
	int rc = -EIO;
	if (run("ip netns add %s", net->sw) ||
	    run("ip -n %s link set lo up && ip -n %s link add br0 type bridge && "
		"ip -n %s link set br0 up",
		net->sw, net->sw, net->sw))
		goto fail;
	net->have_netem = run("ip netns exec %s tc qdisc add dev lo root netem delay 1ms && "
			      "ip netns exec %s tc qdisc del dev lo root",
			      net->sw, net->sw) == 0;
	net->have_delay = net->have_netem || access("/dev/net/tun", R_OK | W_OK) == 0;
	for (int i = 0; i < nhosts; i++) {
		snprintf(net->ns[i], sizeof(net->ns[i]), "%s-h%d", net->prefix, i);
		snprintf(net->ip[i], sizeof(net->ip[i]), "10.77.0.%d", i + 2);
		net->nhosts = i + 1;
		if (run("ip netns add %s", net->ns[i]) ||
		    run("ip -n %s link add p%d type veth peer name eth0 netns %s", net->sw, i,
			net->ns[i]) ||
		    run("ip -n %s link set p%d master br0 && ip -n %s link set p%d up", net->sw, i,
			net->sw, i) ||
		    run("ip -n %s link set lo up && ip -n %s addr add %s/24 dev eth0 && "
			"ip -n %s link set eth0 up",
			net->ns[i], net->ns[i], net->ip[i], net->ns[i]))
			goto fail;
		if ((delay_ms > 0 && net->have_netem) || rate) {
			rc = kvn_shape(net, i, net->have_netem ? delay_ms : 0, rate);
			if (rc)
				goto fail;
		}
	}
	return 0;
fail:
	kvn_net_destroy(net);
	return rc;
}

int kvn_test_start(struct kvn_net *net, int nhosts, double delay_ms, const char *rate, int client)
{
	char why[160], bin[600];
	if (kvh_bin("kvfs-meta", bin, sizeof(bin)) || kvh_bin("kvfs-node", bin, sizeof(bin))) {
		printf("skipped: kvfs-meta / kvfs-node not built\n");
		return 77;
	}
	if (kvn_probe(why, sizeof(why))) {
		printf("skipped: %s\n", why);
		return 77;
	}
	int rc = kvn_net_create(net, nhosts, delay_ms, rate);
	if (rc) {
		printf("skipped: cannot build the test network: %s\n", strerror(-rc));
		return 77;
	}
	/* The test itself is the client host: its sockets (and its threads') live there. */
	if ((rc = kvn_enter(net, client))) {
		kvn_net_destroy(net);
		printf("skipped: cannot enter the client namespace: %s\n", strerror(-rc));
		return 77;
	}
	return 0;
}
