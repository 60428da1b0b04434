/* netns_tutil — a small network of "hosts" for cross-host tests: one network namespace per
 * host, each with one interface (eth0, 10.77.0.<i+2>/24) on a veth pair whose other end is a
 * port of a Linux bridge in a namespace of its own (the "switch"). Links are shaped with
 * `tc`: netem (delay + rate) where the kernel has it; else tbf for a rate alone, and for a
 * delay a userspace delayer (tests/link_delay.h) put into the host's path: its switch port
 * moves to a bridge of its own ("dl<i>") whose other port is a TAP device, and a thread
 * passes every frame between that TAP and a second one on the switch ("db<i>"), delay_ms
 * (and the rate) later, both ways. Real packets of the unmodified daemons are delayed.
 *
 * Nothing of the machine's own network is touched: the bridge and every interface live in
 * namespaces this module creates, named "<prefix>-sw" and "<prefix>-h<i>" with a prefix unique
 * per run ("kvn<pid>"). kvn_net_destroy deletes them by name; an atexit hook does it when the
 * test exits without, and kvn_net_create first deletes leftovers of earlier runs whose process
 * is gone (a run killed by SIGKILL). Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2.
 *
 * Not thread-safe: create, shape and destroy from the test's main thread. Every call runs
 * `ip`/`tc` commands, each a few milliseconds.
 */
#ifndef KVFS_TEST_NETNS_TUTIL_H
#define KVFS_TEST_NETNS_TUTIL_H

#include <stddef.h>

struct lkd;

#define KVN_MAX_HOSTS 32

struct kvn_net {
	char prefix[16];
	char sw[32]; /* the switch namespace */
	int nhosts;
	char ns[KVN_MAX_HOSTS][32];	  /* host i's namespace */
	char ip[KVN_MAX_HOSTS][16];	  /* host i's address */
	int have_netem;			  /* 1: kvn_shape delays with netem */
	int have_delay;			  /* 1: kvn_shape can delay (netem, or the TAP delayer) */
	struct lkd *delay[KVN_MAX_HOSTS]; /* host i's TAP delayer, if one is on its path */
};

/* 0 when namespaces, veth pairs and a bridge can be made here, else -errno with the reason
 * in why (for "skipped: <why>"). Creates and deletes one probe namespace. */
int kvn_probe(char *why, size_t cap);

/* Creates nhosts hosts on one switch, all links shaped to delay_ms each way (with netem only:
 * a delayer thread per host would carry all traffic through userspace) and rate (a tc rate
 * such as "10gbit"; NULL: unlimited). Returns 0 or -errno (everything created so far is
 * deleted again). */
int kvn_net_create(struct kvn_net *net, int nhosts, double delay_ms, const char *rate);
void kvn_net_destroy(struct kvn_net *net);

/* Shapes host i's link, both directions: delay_ms each way and rate (NULL: unlimited). With
 * netem, a netem qdisc; without, delay_ms > 0 puts the TAP delayer (doing the rate too) on
 * the path, delay_ms 0 takes it off again and shapes with tbf. -EOPNOTSUPP when delay_ms > 0
 * and !have_delay. Connections across the link survive a reshape (a few ms without it). */
int kvn_shape(struct kvn_net *net, int i, double delay_ms, const char *rate);
/* Round-trip time from the calling thread's namespace to host i in *ms: the best of three
 * TCP connects to a closed port (SYN out, RST back: one round trip through both directions
 * of every shaped link on the way). 0 or -errno (-ETIMEDOUT after 5 s). */
int kvn_rtt_ms(struct kvn_net *net, int i, double *ms);
/* Takes host i's switch port down (0: the host is cut off, as a pulled cable) or up (1). */
int kvn_link(struct kvn_net *net, int i, int up);
/* Cuts (cut = 1) or restores (0) traffic between hosts i and j only, both ways: a blackhole
 * route to the other's address in each of the two hosts. Every other path stays: each still
 * reaches the rest of the network (a partition between two hosts, not a host cut off).
 * Established connections between them stall, as across a failed link. */
int kvn_cut(struct kvn_net *net, int i, int j, int cut);
/* Moves the calling thread into host i's namespace (threads it starts later follow).
 * Call before starting any other thread whose sockets should be there. */
int kvn_enter(struct kvn_net *net, int i);

/* A cross-host test's start, in main before its cmocka group: 0 with net built (nhosts,
 * delay_ms, rate: as kvn_net_create) and the calling thread in host client's namespace; or 77
 * having printed "skipped: <why>" (no kvfs-meta / kvfs-node binary, no namespaces here, the
 * network could not be made or entered), with nothing left to destroy. */
int kvn_test_start(struct kvn_net *net, int nhosts, double delay_ms, const char *rate, int client);

#endif
