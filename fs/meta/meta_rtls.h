/* mrtls — libraft's transport over kvfs's TLS (docs/meta.md, "Raft transport").
 *
 * libraft's own TCP transport (raft_uv_tcp_init) is plaintext and unauthenticated: whoever
 * reaches a replica's Raft port could append entries or force elections. This one runs the
 * same TLS 1.3 as every other kvfs connection (kvp_sock: an external PSK derived from the
 * cluster secret, both ends prove it in the handshake; docs/protocol.md, "Transport").
 *
 * libraft wants a uv_stream_t per connection on its loop. Each connection is a socketpair:
 * libraft gets one end as a uv_pipe_t, and two relay threads copy bytes between the other end
 * and the TLS socket, one per direction, with blocking writes (a slow peer stalls its own
 * relay, never the loop; libraft's writes queue in its pipe). The TCP connect, the TLS
 * handshake and the identity exchange (the dialer's id and Raft address, which libraft's own
 * transport sends in clear) run on these threads too, with deadlines, so a peer that never
 * finishes its handshake holds one thread until the deadline and never the loop. A peer that
 * fails the handshake is closed and logged ("refused"), and libraft never sees it.
 *
 * Threads: mrtls_init, and every callback libraft calls (init, listen, connect, close), on the
 * loop thread. */
#ifndef KVFS_META_RTLS_H
#define KVFS_META_RTLS_H

#include "kvp_frame.h"

#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

/* Fills t with the TLS transport on loop, keeping a copy of s (which must not be in
 * insecure_plaintext mode: meta uses raft_uv_tcp_init then). 0 or RAFT_NOMEM. After libraft
 * closed it (raft_close's callback), free it with mrtls_free. */
int mrtls_init(struct raft_uv_transport *t, uv_loop_t *loop, const struct kvp_secret *s);
void mrtls_free(struct raft_uv_transport *t);

#endif
