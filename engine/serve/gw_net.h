/* gw_net — the gateway's listening side: who may hold a connection, and HTTPS.
 *
 * Connection limits: libmicrohttpd runs one thread per connection, so connections are the
 * gateway's scarce resource. gw_net admits a connection only while its source address holds
 * fewer than per_address and all addresses together fewer than total; loopback sources
 * (127.0.0.0/8, where health probes and the operator run) get GW_NET_LOOPBACK_RESERVE slots
 * past total, so /health answers while remote clients fill the gateway. A refused connection is
 * closed at once (no HTTP answer) and counted in kvfs_gateway_connections_refused_total{reason}
 * ("per_address", "total"); kvfs_gateway_connections_open is the number held now. Idle
 * connections are closed by MHD's connection timeout (gw.c).
 *
 * Threading: gw_net_accept runs on MHD's listening thread; gw_net_notify on it (started) and
 * on connection threads (closed); one mutex protects the table.
 */
#ifndef KVFS_GW_NET_H
#define KVFS_GW_NET_H

#include <stddef.h>
#include <sys/socket.h>

#include <microhttpd.h>

#define GW_NET_LOOPBACK_RESERVE 16

struct gw_net;
struct met_reg;

/* total, per_address: > 0. Registers the metrics in reg. 0, -EINVAL, -ENOMEM. */
int gw_net_create(unsigned total, unsigned per_address, struct met_reg *reg, struct gw_net **out);
void gw_net_destroy(struct gw_net *n);
/* The most connections MHD itself may hold (total + the loopback reserve). */
unsigned gw_net_mhd_limit(const struct gw_net *n);

/* MHD_OPTION_ACCEPT_POLICY (cls = the gw_net). */
enum MHD_Result gw_net_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
/* MHD_OPTION_NOTIFY_CONNECTION (cls = the gw_net). */
void gw_net_notify(void *cls, struct MHD_Connection *c, void **socket_context,
		   enum MHD_ConnectionNotificationCode code);

/* Reads a PEM certificate chain and key for MHD_USE_TLS: 0 and malloc'd NUL-terminated
 * *cert, *key (the caller frees; they must outlive the daemon), -ENOENT / -EACCES, -EINVAL
 * (empty, larger than 1 MiB, or not PEM: a log line says which), -ENOTSUP when libmicrohttpd
 * was built without TLS. */
int gw_net_tls_load(const char *cert_path, const char *key_path, char **cert, char **key);

#endif
