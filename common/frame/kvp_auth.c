/* The cluster secret, and the insecure plaintext mode's handshake: challenge-response on the
 * secret (HMAC-SHA256). Both sides contribute a random nonce and both prove the secret; MACs
 * are compared in constant time. It authenticates the start of a connection only: nothing
 * protects the frames after it (docs/protocol.md, "Insecure plaintext mode"). */
#define KVFS_LOG_TAG "auth"
#include "kvp_int.h"
#include "log.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	const char *pt = getenv("KVFS_INSECURE_PLAINTEXT");
	s->insecure_plaintext = pt && strcmp(pt, "1") == 0;
	if (s->insecure_plaintext)
		klog_warn("KVFS_INSECURE_PLAINTEXT=1: cluster connections are NOT encrypted and "
			  "frames are NOT integrity-protected; anyone on the network path can read "
			  "and change them. Every peer must run the same way.");
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

/* Receives one handshake frame of exactly `want` body bytes and opcode op. */
static int recv_exact(struct kvp_sock *k, uint16_t op, uint8_t *out, size_t want, int32_t *status,
		      int64_t dl)
{
	struct kvp_hdr h;
	uint8_t *body = NULL;
	int rc = kvp_recv_dl(k, &h, &body, 256, dl);
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

int kvp_auth_server(struct kvp_sock *k, const struct kvp_secret *s, int64_t dl)
{
	uint8_t ns[NONCE], in[NONCE + MAC], expect[MAC], ms[MAC];
	int32_t st = 0;
	if (RAND_bytes(ns, NONCE) != 1)
		return -EIO;
	struct kvp_hdr h = {.op = KVP_OP_HELLO, .id = 0};
	int rc = kvp_send_dl(k, &h, ns, NONCE, NULL, 0, dl);
	if (rc)
		return rc;
	rc = recv_exact(k, KVP_OP_AUTH, in, sizeof(in), &st, dl);
	if (rc)
		return rc;
	if (st)
		return -EPROTO;
	mac(s, "kvfs-v1-client", ns, in, expect);
	struct kvp_hdr r = {.op = KVP_OP_AUTH, .flags = KVP_F_RESP};
	if (CRYPTO_memcmp(expect, in + NONCE, MAC) != 0) {
		r.status = -EACCES;
		kvp_send_dl(k, &r, NULL, 0, NULL, 0, dl);
		return -EACCES;
	}
	mac(s, "kvfs-v1-server", in, ns, ms);
	return kvp_send_dl(k, &r, ms, MAC, NULL, 0, dl);
}

int kvp_auth_client(struct kvp_sock *k, const struct kvp_secret *s, int64_t dl)
{
	uint8_t ns[NONCE], out[NONCE + MAC], got[MAC], expect[MAC];
	int32_t st = 0;
	int rc = recv_exact(k, KVP_OP_HELLO, ns, NONCE, &st, dl);
	if (rc == -ETIMEDOUT)
		klog_warn(
		    "no plaintext HELLO from the server: is it running TLS (the default) while "
		    "this process has KVFS_INSECURE_PLAINTEXT=1?");
	if (rc)
		return rc;
	if (st || RAND_bytes(out, NONCE) != 1)
		return -EPROTO;
	mac(s, "kvfs-v1-client", ns, out, out + NONCE);
	struct kvp_hdr h = {.op = KVP_OP_AUTH};
	rc = kvp_send_dl(k, &h, out, sizeof(out), NULL, 0, dl);
	if (rc)
		return rc;
	rc = recv_exact(k, KVP_OP_AUTH, got, MAC, &st, dl);
	if (rc == -ECONNRESET && st == 0)
		return -EACCES; /* server hung up on our proof */
	if (rc)
		return rc;
	if (st)
		return st == -EACCES ? -EACCES : -EPROTO;
	mac(s, "kvfs-v1-server", out, ns, expect);
	if (CRYPTO_memcmp(expect, got, MAC) != 0)
		return -EACCES;
	return 0;
}
