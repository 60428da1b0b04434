/* The TLS 1.3 handshake on a kvp_sock: an external PSK derived from the cluster secret, so
 * there are no certificates to make, ship or renew, and knowing the secret is exactly what lets
 * a process into the cluster, as before TLS. docs/protocol.md, "Transport", gives the choice
 * and its reasons.
 *
 *   psk      = HKDF-SHA256(salt "kvfs-tls13-psk-salt", ikm secret, info "kvfs v1 tls13 external
 *              psk", 32 bytes)
 *   identity = "kvfs-cluster-v1"
 *   TLS 1.3 only, TLS_AES_128_GCM_SHA256 only, psk_dhe_ke (an X25519 or P-256 exchange in every
 *   handshake: recorded traffic stays secret even if the cluster secret leaks later), no session
 *   tickets, kernel TLS requested. */
#define KVFS_LOG_TAG "tls"
#include "kvp_int.h"
#include "log.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <poll.h>
#include <signal.h>
#include <string.h>

#define PSK_ID	   "kvfs-cluster-v1"
#define PSK_LEN	   32
#define PSK_SALT   "kvfs-tls13-psk-salt"
#define PSK_INFO   "kvfs v1 tls13 external psk"
#define SUITE	   "TLS_AES_128_GCM_SHA256"
#define SUITE_ID_0 0x13
#define SUITE_ID_1 0x01

/* Process-wide and immutable once made: OpenSSL contexts may be shared by threads for
 * SSL_new. The secret travels per connection in the SSL's app data. */
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static SSL_CTX *ctx_client, *ctx_server;

static int derive_psk(const struct kvp_secret *s, uint8_t out[PSK_LEN])
{
	EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
	size_t len = PSK_LEN;
	int ok =
	    pc && EVP_PKEY_derive_init(pc) > 0 && EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) > 0 &&
	    EVP_PKEY_CTX_set1_hkdf_salt(pc, (const uint8_t *)PSK_SALT, sizeof(PSK_SALT) - 1) > 0 &&
	    EVP_PKEY_CTX_set1_hkdf_key(pc, s->key, (int)s->len) > 0 &&
	    EVP_PKEY_CTX_add1_hkdf_info(pc, (const uint8_t *)PSK_INFO, sizeof(PSK_INFO) - 1) > 0 &&
	    EVP_PKEY_derive(pc, out, &len) > 0 && len == PSK_LEN;
	EVP_PKEY_CTX_free(pc);
	return ok ? 0 : -EIO;
}

static SSL_SESSION *psk_session(SSL *ssl)
{
	const struct kvp_secret *s = SSL_get_app_data(ssl);
	static const unsigned char id[2] = {SUITE_ID_0, SUITE_ID_1};
	const SSL_CIPHER *c = SSL_CIPHER_find(ssl, id);
	uint8_t key[PSK_LEN];
	if (!s || !c || derive_psk(s, key))
		return NULL;
	SSL_SESSION *ss = SSL_SESSION_new();
	if (ss &&
	    (!SSL_SESSION_set1_master_key(ss, key, sizeof(key)) || !SSL_SESSION_set_cipher(ss, c) ||
	     !SSL_SESSION_set_protocol_version(ss, TLS1_3_VERSION))) {
		SSL_SESSION_free(ss);
		ss = NULL;
	}
	OPENSSL_cleanse(key, sizeof(key));
	return ss;
}

static int use_psk_cb(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
		      SSL_SESSION **sess)
{
	*sess = NULL;
	if (md && !EVP_MD_is_a(md, "SHA256"))
		return 1; /* a HelloRetryRequest chose another hash: no PSK for it */
	SSL_SESSION *ss = psk_session(ssl);
	if (!ss)
		return 0;
	*id = (const unsigned char *)PSK_ID;
	*idlen = sizeof(PSK_ID) - 1;
	*sess = ss;
	return 1;
}

static int find_psk_cb(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess)
{
	*sess = NULL;
	if (idlen != sizeof(PSK_ID) - 1 || memcmp(id, PSK_ID, idlen) != 0)
		return 1; /* not ours: the handshake fails (no certificate to fall back on) */
	*sess = psk_session(ssl);
	return *sess ? 1 : 0;
}

static SSL_CTX *make_ctx(int server)
{
	SSL_CTX *c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	if (!c)
		return NULL;
	if (!SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(c, SUITE)) {
		SSL_CTX_free(c);
		return NULL;
	}
	/* KTLS: the kernel encrypts sends (and decrypts receives where supported) when its tls
	 * ULP is there; otherwise OpenSSL silently stays in user space. IGNORE_UNEXPECTED_EOF:
	 * peers close without close_notify; frames are length-prefixed, so a cut frame is still
	 * an error one layer up. */
	SSL_CTX_set_options(c,
			    SSL_OP_ENABLE_KTLS | SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
	SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_num_tickets(c, 0);
	/* No read-ahead: with it OpenSSL memmoves the unread rest of its buffer forward as records
	 * are consumed; measured slower (store read 0.5x plaintext instead of 0.85x). */
	if (server)
		SSL_CTX_set_psk_find_session_callback(c, find_psk_cb);
	else
		SSL_CTX_set_psk_use_session_callback(c, use_psk_cb);
	return c;
}

static void ctx_init(void)
{
	/* OpenSSL's socket BIO writes with write(2): without this a peer's reset is a SIGPIPE
	 * that kills the process. Leaves a handler the process installed alone. */
	struct sigaction sa;
	if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL)
		signal(SIGPIPE, SIG_IGN);
	ctx_client = make_ctx(0);
	ctx_server = make_ctx(1);
	if (!ctx_client || !ctx_server)
		klog_error("cannot set up TLS: %s", ERR_reason_error_string(ERR_get_error()));
}

/* Maps a failed handshake to an errno, logging what a person needs to fix it. */
static int hs_error(int server, int e, unsigned long ee, int saved)
{
	int reason = ERR_GET_REASON(ee);
	if (e == SSL_ERROR_SYSCALL ||
	    (e == SSL_ERROR_SSL && reason == SSL_R_UNEXPECTED_EOF_WHILE_READING))
		return saved && saved != EPIPE ? -saved : -ECONNRESET;
	if (e != SSL_ERROR_SSL)
		return -EPROTO;
	/* The server checks the PSK binder; a client learns of a mismatch from the alert. */
	if (reason == SSL_R_BINDER_DOES_NOT_VERIFY ||
	    (reason >= SSL_AD_REASON_OFFSET && reason < SSL_AD_REASON_OFFSET + 256))
		return -EACCES;
	if (!server &&
	    (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG))
		klog_error("the server did not answer in TLS (%s): is it running with "
			   "KVFS_INSECURE_PLAINTEXT=1 while this process is not?",
			   ERR_reason_error_string(ee));
	else
		klog_debug("TLS handshake failed: %s", ERR_reason_error_string(ee));
	return -EPROTO;
}

int kvp_tls_handshake(struct kvp_sock *k, const struct kvp_secret *s, int server, int64_t deadline)
{
	pthread_once(&ctx_once, ctx_init);
	SSL_CTX *c = server ? ctx_server : ctx_client;
	if (!c)
		return -EIO;
	SSL *ssl = SSL_new(c);
	if (!ssl)
		return -ENOMEM;
	if (!SSL_set_fd(ssl, k->fd)) {
		SSL_free(ssl);
		return -ENOMEM;
	}
	SSL_set_app_data(ssl, (void *)s);
	k->ssl = ssl; /* freed with k from here on */
	for (;;) {
		ERR_clear_error();
		int r = server ? SSL_accept(ssl) : SSL_connect(ssl);
		if (r == 1)
			break;
		int e = SSL_get_error(ssl, r), saved = errno;
		unsigned long ee = ERR_peek_error();
		ERR_clear_error();
		if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
			SSL_set_app_data(ssl, NULL);
			return hs_error(server, e, ee, saved);
		}
		int64_t left = deadline - kvp_now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = {.fd = k->fd,
				   .events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT};
		int pr = poll(&p, 1, (int)(left > 1 << 30 ? 1 << 30 : left));
		if (pr == 0)
			return -ETIMEDOUT;
		if (pr < 0 && errno != EINTR)
			return -errno;
	}
	SSL_set_app_data(ssl, NULL); /* the secret may go; the keys are in the SSL now */
	k->ktls_send = BIO_get_ktls_send(SSL_get_wbio(ssl)) ? 1 : 0;
	return 0;
}
