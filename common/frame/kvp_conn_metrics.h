/* kvp_conn_metrics — a server's connection counters (struct kvp_conn_stats) as Prometheus
 * families <prefix>_connections_accepted_total, _connections_refused_total (over the caps on
 * unauthenticated connections), _handshake_failures_total, _handshake_timeouts_total and
 * _accept_errors_total, for a daemon's metrics collector, and the process's own outgoing
 * handshakes (kvp_client_conn_stats_collect). Header-only: for targets that link
 * both kvfs_frame and kvfs_metrics. Reads the counters without a lock (they are atomics). */
#ifndef KVFS_KVP_CONN_METRICS_H
#define KVFS_KVP_CONN_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#include "kvp_frame.h"
#include "metrics.h"

static inline void kvp_conn_stats_collect(struct met_out *o, const char *prefix,
					  const struct kvp_conn_stats *s)
{
	static const struct {
		const char *suffix, *help;
		size_t off;
	} f[] = {
	    {"connections_accepted_total", "Cluster connections accepted",
	     offsetof(struct kvp_conn_stats, accepted)},
	    {"connections_refused_total",
	     "Connections closed at once: too many still in their handshake (in all or from one "
	     "address)",
	     offsetof(struct kvp_conn_stats, refused)},
	    {"handshake_failures_total",
	     "Handshakes failed: wrong cluster secret, not TLS, or a plaintext/TLS mismatch",
	     offsetof(struct kvp_conn_stats, hs_failed)},
	    {"handshake_timeouts_total", "Handshakes not complete within the 5 s deadline",
	     offsetof(struct kvp_conn_stats, hs_timeout)},
	    {"accept_errors_total", "accept() failures (EMFILE: out of descriptors, ...)",
	     offsetof(struct kvp_conn_stats, accept_err)},
	};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		char name[128];
		snprintf(name, sizeof(name), "%s_%s", prefix, f[i].suffix);
		const _Atomic uint64_t *c = (const _Atomic uint64_t *)((const char *)s + f[i].off);
		met_out_family(o, name, "counter", f[i].help);
		met_out_sample(o, name, NULL, (double)atomic_load(c));
	}
}

/* kvp_client_conn_stats as <prefix>_handshake_failures_total and _handshake_timeouts_total:
 * the handshakes this process started. */
static inline void kvp_client_conn_stats_collect(struct met_out *o, const char *prefix)
{
	const struct kvp_conn_stats *s = kvp_client_conn_stats();
	char name[128];
	snprintf(name, sizeof(name), "%s_handshake_failures_total", prefix);
	met_out_family(o, name, "counter",
		       "Handshakes this process started that failed: wrong cluster secret, a "
		       "plaintext/TLS mismatch, or a peer that is not kvfs");
	met_out_sample(o, name, NULL, (double)atomic_load(&s->hs_failed));
	snprintf(name, sizeof(name), "%s_handshake_timeouts_total", prefix);
	met_out_family(o, name, "counter",
		       "Handshakes this process started that the peer did not complete in time");
	met_out_sample(o, name, NULL, (double)atomic_load(&s->hs_timeout));
}

#endif
