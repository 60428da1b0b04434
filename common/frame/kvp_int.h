/* kvp_frame's private interface between its files: the connection object, deadline I/O and the
 * two handshakes. Not installed, not included outside common/frame. */
#ifndef KVFS_KVP_INT_H
#define KVFS_KVP_INT_H

#include "kvp_frame.h"

#include <openssl/ssl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>

struct kvp_sock {
	int fd;		       /* non-blocking; owned */
	SSL *ssl;	       /* NULL in plaintext mode; every call on it under io_mu */
	pthread_mutex_t io_mu; /* OpenSSL objects are not for two threads at once */
	int send_timeout_ms;   /* <= 0: none */
	int ktls_send;
};

/* CLOCK_MONOTONIC in ms; a deadline is such a time, or -1 for none. */
int64_t kvp_now_ms(void);
/* Reads exactly n bytes by deadline: 0, -ECONNRESET at EOF, -ETIMEDOUT, -EBADMSG, -errno. */
int kvp_io_read(struct kvp_sock *k, void *p, size_t n, int64_t deadline);
/* Writes all of iov by deadline; with deadline -1, fails -EAGAIN after k->send_timeout_ms
 * without progress. 0 or -errno. Modifies iov. */
int kvp_io_writev(struct kvp_sock *k, struct iovec *iov, int n, int64_t deadline);
int kvp_send_dl(struct kvp_sock *k, struct kvp_hdr *h, const void *body, size_t body_len,
		const void *bulk, size_t bulk_len, int64_t deadline);
int kvp_recv_dl(struct kvp_sock *k, struct kvp_hdr *h, uint8_t **body, uint32_t max_body,
		int64_t deadline);

/* The plaintext HMAC handshake (kvp_auth.c) and the TLS one (kvp_tls.c), on a kvp_sock whose
 * ssl is NULL (plaintext) or freshly made (TLS), within deadline. 0 or as kvp_sock_open. */
int kvp_auth_server(struct kvp_sock *k, const struct kvp_secret *s, int64_t deadline);
int kvp_auth_client(struct kvp_sock *k, const struct kvp_secret *s, int64_t deadline);
int kvp_tls_handshake(struct kvp_sock *k, const struct kvp_secret *s, int server, int64_t deadline);

#endif
