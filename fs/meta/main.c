/* kvfs-meta: the metadata server daemon. Flags and config file come from one option table
 * (--help lists them); SIGTERM/SIGINT close the database cleanly and exit 0. */
#define KVFS_LOG_TAG "meta"
#include "cfg.h"
#include "kvp.h"
#include "log.h"
#include "meta.h"
#include "meta_metrics.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The daemon's options: the table fills meta's own options (o) directly, and the rest only the
 * daemon uses. */
struct meta_cfg {
	struct meta_opts o;
	char listen[CFG_STR_MAX];
	char db[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	char addr_file[CFG_STR_MAX];
	char advertise[CFG_STR_MAX];
	char metrics_listen[CFG_STR_MAX], metrics_addr_file[CFG_STR_MAX];
	char ttl_rules[CFG_STR_MAX]; /* parsed into o.rules */
	char raft_peers[CFG_STR_MAX], raft_dir[CFG_STR_MAX];
	int raft_insecure_network;
	int allow_degraded;
	int64_t log_level;
};

#define F(x) offsetof(struct meta_cfg, x)
static const struct cfg_opt opts[] = {
    {"listen", CFG_STR, F(listen), 0, 0, "127.0.0.1:7070", "HOST:PORT to serve (port 0: any)"},
    {"db", CFG_STR, F(db), 0, 0, NULL, "RocksDB directory (required)"},
    {"secret-file", CFG_STR, F(secret_file), 0, 0, NULL, "cluster secret file (required)"},
    {"addr-file", CFG_STR, F(addr_file), 0, 0, NULL,
     "once listening, write HOST:PORT here (atomically)"},
    {"advertise", CFG_STR, F(advertise), 0, 0, NULL,
     "HOST clients reach this meta at (port: the bound one), where replicas redirect them "
     "(default: the listen host; 127.0.0.1 for 0.0.0.0)"},
    {"k", CFG_INT, F(o.k), 1, 64, "10", "data chunks per stripe (cluster default)"},
    {"m", CFG_INT, F(o.m), 0, 16, "1", "parity chunks per stripe (cluster default)"},
    {"chunk-size", CFG_SIZE, F(o.chunk_size), 4096, 16 << 20, "1M",
     "largest chunk (cluster default; multiple of 4K)"},
    {"node-timeout", CFG_SECS, F(o.node_timeout_s), 0.05, 86400, "10s",
     "a node without heartbeat this long is down"},
    {"write-timeout", CFG_SECS, F(o.write_timeout_s), 1, 30 * 86400, "1h",
     "an ALLOC not committed this long is aborted, its chunks deleted"},
    {"unlink-delay", CFG_SECS, F(o.unlink_delay_s), 0, 86400, "5s",
     "chunks of an unlinked or replaced file stay this long for readers that still have it open"},
    {"gc-interval", CFG_SECS, F(o.gc_interval_s), 0.05, 3600, "1s",
     "background pass period (deletions, node timeouts)"},
    {"ttl", CFG_SECS, F(o.ttl_s), 0, 1e9, "72h",
     "a file expires this long after its last access (0: never)"},
    {"ttl-rules", CFG_STR, F(ttl_rules), 0, 0, NULL,
     "per-directory TTLs: /dir=TIME,/other=TIME (0: never; the deepest rule wins)"},
    {"atime-granularity", CFG_SECS, F(o.atime_granularity_s), 0, 86400, "1m",
     "access times move only by at least this (fewer writes)"},
    {"retention-interval", CFG_SECS, F(o.retention_interval_s), 0.05, 86400, "10s",
     "period of the TTL expiry pass"},
    {"high-watermark", CFG_INT, F(o.high_wm), 0, 100, "90",
     "percent of raw capacity of up nodes that starts LRU eviction (0: never)"},
    {"low-watermark", CFG_INT, F(o.low_wm), 0, 100, "80", "eviction stops under this percent"},
    {"gc-grace", CFG_SECS, F(o.gc_grace_s), 0, 1e9, "1h",
     "a chunk no metadata references is deleted once older than this"},
    {"orphan-interval", CFG_SECS, F(o.orphan_interval_s), 0, 1e9, "1h",
     "period of the orphan-chunk pass over every node (0: only on request)"},
    {"repair-delay", CFG_SECS, F(o.repair_delay_s), 0, 1e9, "15m",
     "a node down this long is repaired automatically (0: never)"},
    {"repair-rate", CFG_SIZE, F(o.repair_rate), 0, 1e15, "100M",
     "bytes/s background repair rebuilds (0: unlimited; kvfs repair is unlimited)"},
    {"scrub-interval", CFG_SECS, F(o.scrub_interval_s), 0, 1e9, "7d",
     "a background scrub starts this long after the last (0: never)"},
    {"scrub-rate", CFG_SIZE, F(o.scrub_rate), 0, 1e15, "20M",
     "bytes/s background scrub reads (0: unlimited)"},
    {"write-redundancy", CFG_INT, F(o.write_redundancy), 0, 16, "0",
     "parity chunks every stripe must store for a write to succeed: 0 writes while k of k+m "
     "nodes take chunks (the missing ones repaired later); m or more refuses unless all k+m "
     "are stored"},
    {"allow-degraded", CFG_BOOL, F(allow_degraded), 0, 0, "false",
     "ignored (kept for old command lines): degraded writes are the default, see "
     "--write-redundancy"},
    {"sync", CFG_BOOL, F(o.sync), 0, 0, "false", "fsync the WAL on every commit"},
    {"block-cache", CFG_SIZE, F(o.block_cache), 0, 1e15, "256M",
     "RocksDB block cache for LOOKUP/GETATTR point reads (0: none)"},
    {"bloom-bits", CFG_INT, F(o.bloom_bits), 0, 64, "10",
     "bloom filter bits per key in new table files, ~1 % false positives at 10 (0: none, "
     "and existing filters unused)"},
    {"mmap-reads", CFG_BOOL, F(o.mmap_reads), 0, 0, "false",
     "read table files through mmap instead of pread"},
    {"verify-reads", CFG_BOOL, F(o.verify_reads), 0, 0, "true",
     "check block checksums on LOOKUP/GETATTR point reads (compaction always checks)"},
    {"metrics-listen", CFG_STR, F(metrics_listen), 0, 0, NULL,
     "HOST:PORT to serve Prometheus /metrics on (port 0: any; empty: off)"},
    {"metrics-addr-file", CFG_STR, F(metrics_addr_file), 0, 0, NULL,
     "once serving metrics, write their HOST:PORT here (atomically)"},
    {"raft-id", CFG_INT, F(o.raft_id), 0, 1000000, "0",
     "this replica's id in --raft-peers (0: a single meta, no replication)"},
    {"raft-peers", CFG_STR, F(raft_peers), 0, 0, NULL,
     "every replica as ID=HOST:PORT,... (their Raft addresses, not --listen)"},
    {"raft-dir", CFG_STR, F(raft_dir), 0, 0, NULL,
     "directory of this replica's Raft log and snapshots (required with --raft-id)"},
    {"raft-insecure-network", CFG_BOOL, F(raft_insecure_network), 0, 0, "false",
     "with KVFS_INSECURE_PLAINTEXT=1 only (Raft is TLS otherwise): allow --raft-peers off "
     "loopback over plaintext, unauthenticated Raft, on a private network no one else reaches"},
    {"raft-election-timeout", CFG_SECS, F(o.raft_election_s), 0.05, 60, "1s",
     "a follower that hears no leader this long starts an election"},
    {"raft-join", CFG_BOOL, F(o.raft_join), 0, 0, "false",
     "a new replica of a running group: wait to be added (kvfs meta add) instead of "
     "bootstrapping --raft-peers"},
    {"raft-snapshot-every", CFG_INT, F(o.raft_snapshot_every), 16, 100000000, "100000",
     "Raft log entries between snapshots of the database (the log before is dropped, a fifth "
     "kept for followers that lag)"},
    {"raft-snapshot-bytes", CFG_SIZE, F(o.raft_snapshot_bytes), 0, 1e12, "64M",
     "... or once the Raft entries since the last snapshot hold this many bytes (libraft "
     "keeps them all in memory until then; 0: by --raft-snapshot-every only)"},
    {"raft-snapshot-compress", CFG_BOOL, F(o.raft_snapshot_compress), 0, 0, "true",
     "libraft stores snapshots LZ4-compressed (its default); false: as they are"},
    {"bench-fill", CFG_BOOL, F(o.bench_fill), 0, 0, "false",
     "BENCHMARKS ONLY: accept BFILL, which fills the namespace with files whose chunks no "
     "node holds (kvfs-meta-bench --grow); never on a cache that serves data"},
    {"log-level", CFG_INT, F(log_level), 0, 3, "2", "0 error, 1 warn, 2 info, 3 debug"},
    CFG_END,
};

/* "/a=1h,/b/c=30m" -> rules. Times take s/m/h/d suffixes. -EINVAL on anything else. */
static int parse_rules(const char *text, struct meta_opts *o)
{
	char buf[CFG_STR_MAX], *save = NULL;
	snprintf(buf, sizeof(buf), "%s", text);
	for (char *r = strtok_r(buf, ",", &save); r; r = strtok_r(NULL, ",", &save)) {
		char *eq = strrchr(r, '=');
		if (!eq || r[0] != '/' || eq - r >= (long)sizeof(o->rules[0].path) ||
		    o->nrules == (int)(sizeof(o->rules) / sizeof(o->rules[0])))
			return -EINVAL;
		char *end;
		double v = strtod(eq + 1, &end);
		double mul = *end == 0 || !strcmp(end, "s") ? 1
			     : !strcmp(end, "m")	    ? 60
			     : !strcmp(end, "h")	    ? 3600
			     : !strcmp(end, "d")	    ? 86400
							    : -1;
		if (end == eq + 1 || mul < 0 || v < 0)
			return -EINVAL;
		*eq = 0;
		snprintf(o->rules[o->nrules].path, sizeof(o->rules[0].path), "%s", r);
		o->rules[o->nrules++].ttl_s = v * mul;
	}
	return 0;
}

/* Writes "addr\n" to path via a temporary file and rename, so a reader never sees half. */
static int write_addr_file(const char *path, const char *addr)
{
	char tmp[CFG_STR_MAX + 16];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -errno;
	int ok = fprintf(f, "%s\n", addr) > 0;
	ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
	ok &= fclose(f) == 0;
	if (!ok || rename(tmp, path)) {
		int e = errno ? -errno : -EIO;
		unlink(tmp);
		return e;
	}
	return 0;
}

/* 1 when every ID=HOST:PORT of a --raft-peers list has its host on 127.0.0.0/8. */
static int raft_peers_loopback(const char *peers)
{
	for (const char *p = peers; *p;) {
		const char *eq = strchr(p, '='), *end = strchr(p, ',');
		if (!end)
			end = p + strlen(p);
		if (!eq || eq > end)
			return 0;
		const char *h = eq + 1;
		if (!(strncmp(h, "127.", 4) == 0 ||
		      (end - h > 10 && strncmp(h, "localhost:", 10) == 0)))
			return 0;
		p = *end ? end + 1 : end;
	}
	return 1;
}

int main(int argc, char **argv)
{
	struct meta_cfg c;
	memset(&c, 0, sizeof(c)); /* what the table does not set: o.rules, o.nrules, pointers */
	int npos = 0;
	int rc = cfg_parse(opts, &c, argc, argv, "", &npos);
	if (rc > 0)
		return 0;
	if (rc < 0)
		return 2;
	if (npos) {
		fprintf(stderr, "kvfs-meta: unexpected argument %s (see --help)\n", argv[1]);
		return 2;
	}
	if (!c.db[0] || !c.secret_file[0]) {
		fprintf(stderr, "kvfs-meta: --db and --secret-file are required (see --help)\n");
		return 2;
	}
	if (c.o.chunk_size % 4096) {
		fprintf(stderr, "kvfs-meta: --chunk-size must be a multiple of 4096\n");
		return 2;
	}
	if (c.o.raft_id && (!c.raft_peers[0] || !c.raft_dir[0])) {
		fprintf(stderr, "kvfs-meta: --raft-id needs --raft-peers and --raft-dir\n");
		return 2;
	}
	if (!c.o.raft_id && (c.raft_peers[0] || c.raft_dir[0])) {
		fprintf(stderr, "kvfs-meta: --raft-peers and --raft-dir need --raft-id\n");
		return 2;
	}
	kvfs_log_set_level((int)c.log_level);
	if (c.allow_degraded)
		klog_warn("--allow-degraded is ignored: writes go on with nodes down by default "
			  "(--write-redundancy)");
	char host[KVP_ADDR_MAX];
	uint16_t port;
	if (kvp_addr_parse(c.listen, host, sizeof(host), &port)) {
		fprintf(stderr, "kvfs-meta: bad --listen %s\n", c.listen);
		return 2;
	}
	struct kvp_secret secret;
	if (kvp_secret_load(c.secret_file, &secret))
		return 2;
	/* Raft runs over TLS with the cluster secret (meta_rtls.h) unless the whole cluster was
	 * made plaintext: then libraft's TCP transport, with no encryption or authentication,
	 * and a Raft address off loopback needs the operator's word that the network is private. */
	if (c.o.raft_id && secret.insecure_plaintext && !c.raft_insecure_network &&
	    !raft_peers_loopback(c.raft_peers)) {
		fprintf(stderr,
			"kvfs-meta: --raft-peers %s: a Raft address off loopback (127.0.0.0/8), "
			"and with KVFS_INSECURE_PLAINTEXT=1 the Raft transport has no encryption "
			"or authentication (anyone who reaches it could write entries): give "
			"--raft-insecure-network once these ports are on a private network only\n",
			c.raft_peers);
		return 2;
	}

	/* Signals are taken synchronously by main (sigwait); every thread inherits the mask. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct meta_opts *mo = &c.o;
	mo->db_path = c.db;
	mo->secret = &secret;
	mo->raft_peers = c.raft_peers;
	mo->raft_dir = c.raft_dir;
	if (parse_rules(c.ttl_rules, mo)) {
		fprintf(stderr, "kvfs-meta: bad --ttl-rules %s (want /dir=TIME,...)\n",
			c.ttl_rules);
		return 2;
	}
	if (c.o.low_wm > c.o.high_wm) {
		fprintf(stderr, "kvfs-meta: --low-watermark is above --high-watermark\n");
		return 2;
	}
	struct meta *m;
	rc = meta_open(mo, &m);
	if (rc) {
		klog_error("cannot open metadata: %s", kvp_strerror(rc));
		return 1;
	}
	struct meta_metrics *mm = NULL;
	rc = meta_metrics_create(&secret, &mm);
	if (rc) {
		klog_error("cannot set up metrics: %s", kvp_strerror(rc));
		meta_close(m);
		return 1;
	}
	struct kvp_server_opts so = {.name = "meta",
				     .host = host,
				     .port = port,
				     .secret = &secret,
				     .handler = meta_handle,
				     .ctx = m,
				     .on_reply = meta_metrics_on_reply,
				     .stats_ctx = mm,
				     .conn_stats = meta_metrics_conn_stats(mm)};
	struct kvp_server *srv;
	rc = kvp_server_start(&so, &srv);
	if (rc) {
		klog_error("cannot listen on %s: %s", c.listen, kvp_strerror(rc));
		meta_metrics_free(mm);
		meta_close(m);
		return 1;
	}
	char addr[KVP_ADDR_MAX + 8];
	snprintf(addr, sizeof(addr), "%s:%u", strcmp(host, "0.0.0.0") ? host : "127.0.0.1",
		 kvp_server_port(srv));
	klog_info("serving on %s (k=%lld m=%lld chunk %llu, sync %s)", addr, (long long)mo->k,
		  (long long)mo->m, (unsigned long long)mo->chunk_size, mo->sync ? "on" : "off");
	char adv[KVP_ADDR_MAX + 8];
	snprintf(adv, sizeof(adv), "%.*s:%u", KVP_ADDR_MAX - 8, c.advertise, kvp_server_port(srv));
	if ((rc = meta_set_addr(m, c.advertise[0] ? adv : addr)))
		klog_error("bad --advertise %s", c.advertise);
	if (rc || (rc = meta_metrics_serve(mm, addr, c.metrics_listen, c.metrics_addr_file)) ||
	    (c.addr_file[0] && (rc = write_addr_file(c.addr_file, addr)))) {
		klog_error("cannot start: %s", kvp_strerror(rc));
		kvp_server_stop(srv);
		meta_metrics_free(mm);
		meta_close(m);
		return 1;
	}
	int sig = 0;
	sigwait(&set, &sig);
	klog_info("signal %d: shutting down", sig);
	kvp_server_stop(srv);
	meta_metrics_free(mm);
	meta_close(m);
	return 0;
}
