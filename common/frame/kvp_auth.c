/* Challenge-response authentication on the cluster secret (HMAC-SHA256, OpenSSL).
 * Both sides contribute a random nonce and both prove the secret, so neither a client without
 * it nor a server impersonating the cluster gets past the handshake; MACs are compared in
 * constant time. docs/protocol.md gives the exact bytes. */
#define KVFS_LOG_TAG "auth"
#include "kvp_frame.h"
#include "log.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#define NONCE 32
#define MAC   32

int kvp_secret_from_string(const char *text, struct kvp_secret *s)
{
	size_t n = strlen(text);
	while (n && (text[n - 1] == '\n' || text[n - 1] == '\r'))
		n--;
	if (n < 16 || n > sizeof(s->key)) {
		klog_error("cluster secret must be 16..64 bytes, got %zu", n);
		return -EINVAL;
	}
	memcpy(s->key, text, n);
	s->len = n;
	return 0;
}

int kvp_secret_load(const char *path, struct kvp_secret *s)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		klog_error("cannot read cluster secret %s: %s", path, strerror(errno));
		return -EINVAL;
	}
	char buf[130];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	if (memchr(buf, 0, n)) {
		klog_error("cluster secret %s contains a NUL byte", path);
		return -EINVAL;
	}
	return kvp_secret_from_string(buf, s);
}

static void mac(const struct kvp_secret *s, const char *label, const uint8_t *a, const uint8_t *b,
		uint8_t out[MAC])
{
	uint8_t msg[16 + 2 * NONCE];
	size_t ll = strlen(label);
	memcpy(msg, label, ll);
	memcpy(msg + ll, a, NONCE);
	memcpy(msg + ll + NONCE, b, NONCE);
	unsigned int outlen = MAC;
	HMAC(EVP_sha256(), s->key, (int)s->len, msg, ll + 2 * NONCE, out, &outlen);
}

static void set_timeout(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Receives one handshake frame of exactly `want` body bytes and opcode op. */
static int recv_exact(int fd, uint16_t op, uint8_t *out, size_t want, int32_t *status)
{
	struct kvp_hdr h;
	uint8_t *body = NULL;
	int rc = kvp_recv(fd, &h, &body, 256);
	if (rc)
		return rc;
	*status = h.status;
	if (h.op != op) {
		rc = -EPROTO;
	} else if (h.status == 0) {
		if (h.len != want)
			rc = -EPROTO;
		else
			memcpy(out, body, want);
	}
	free(body);
	return rc;
}

int kvp_auth_server(int fd, const struct kvp_secret *s, int timeout_ms)
{
	uint8_t ns[NONCE], in[NONCE + MAC], expect[MAC], ms[MAC];
	int32_t st = 0;
	set_timeout(fd, timeout_ms);
	if (RAND_bytes(ns, NONCE) != 1)
		return -EIO;
	struct kvp_hdr h = {.op = KVP_OP_HELLO, .id = 0};
	int rc = kvp_send(fd, &h, ns, NONCE, NULL, 0);
	if (rc)
		return rc;
	rc = recv_exact(fd, KVP_OP_AUTH, in, sizeof(in), &st);
	if (rc)
		return rc;
	if (st)
		return -EPROTO;
	mac(s, "kvfs-v1-client", ns, in, expect);
	struct kvp_hdr r = {.op = KVP_OP_AUTH, .flags = KVP_F_RESP};
	if (CRYPTO_memcmp(expect, in + NONCE, MAC) != 0) {
		r.status = -EACCES;
		kvp_send(fd, &r, NULL, 0, NULL, 0);
		return -EACCES;
	}
	mac(s, "kvfs-v1-server", in, ns, ms);
	rc = kvp_send(fd, &r, ms, MAC, NULL, 0);
	set_timeout(fd, 0);
	return rc;
}

int kvp_auth_client(int fd, const struct kvp_secret *s, int timeout_ms)
{
	uint8_t ns[NONCE], out[NONCE + MAC], got[MAC], expect[MAC];
	int32_t st = 0;
	set_timeout(fd, timeout_ms);
	int rc = recv_exact(fd, KVP_OP_HELLO, ns, NONCE, &st);
	if (rc)
		return rc;
	if (st || RAND_bytes(out, NONCE) != 1)
		return -EPROTO;
	mac(s, "kvfs-v1-client", ns, out, out + NONCE);
	struct kvp_hdr h = {.op = KVP_OP_AUTH};
	rc = kvp_send(fd, &h, out, sizeof(out), NULL, 0);
	if (rc)
		return rc;
	rc = recv_exact(fd, KVP_OP_AUTH, got, MAC, &st);
	if (rc == -ECONNRESET && st == 0)
		return -EACCES; /* server hung up on our proof */
	if (rc)
		return rc;
	if (st)
		return st == -EACCES ? -EACCES : -EPROTO;
	mac(s, "kvfs-v1-server", out, ns, expect);
	if (CRYPTO_memcmp(expect, got, MAC) != 0)
		return -EACCES;
	set_timeout(fd, 0);
	return 0;
}
