/* libFuzzer target: the server side of the connection handshake (kvp_sock_accept) fed arbitrary
 * peer bytes — TLS 1.3 with the PSK (kvp_tls.c) or the insecure plaintext HMAC exchange
 * (kvp_auth.c), picked by the first input byte. The bytes arrive whole, then end of stream, over
 * a socketpair. Checks that it never crashes, never succeeds (the peer cannot know the secret)
 * and fails with one of the errors the header promises, within its deadline. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvp_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 60000) /* stays within the socket buffer: one write, no blocking */
		return 0;
	static struct kvp_secret s;
	if (!s.len) {
		memcpy(s.key, "fuzz-cluster-secret-0123", 24);
		s.len = 24;
	}
	s.insecure_plaintext = data[0] & 1;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		return 0;
	int big = 1 << 20;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	if (size > 1 && write(sv[1], data + 1, size - 1) != (ssize_t)(size - 1)) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	shutdown(sv[1], SHUT_WR);
	struct kvp_sock *k = NULL;
	int rc = kvp_sock_accept(sv[0], &s, 200, &k);
	if (rc == 0)
		abort(); /* a peer without the secret got in */
	if (rc != -EACCES && rc != -EPROTO && rc != -ECONNRESET && rc != -ETIMEDOUT &&
	    rc != -EBADMSG && rc != -EMSGSIZE && rc != -EPIPE)
		abort();
	close(sv[0]);
	close(sv[1]);
	return 0;
}
