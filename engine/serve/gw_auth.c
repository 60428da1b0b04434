#define KVFS_LOG_TAG "gateway"
#include "gw_auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"

#define KEYFILE_MAX (16u << 20) /* a key file past this is a mistake, not a key set */
#define SECRET_MIN  16
#define SECRET_MAX  4096

/* Keys are kept only as SHA-256 digests: a memory dump does not hand out usable keys, and
 * every comparison is over 32 bytes whatever the key's length. */
struct gw_key {
	uint8_t digest[SHA256_DIGEST_LENGTH];
	char tenant[GW_TENANT_MAX + 1];
	int line; /* in the key file, for messages */
};

struct gw_keyset {
	struct gw_key *k;
	int n, cap;
};

struct gw_auth {
	char *keys_path;
	uint8_t *secret; /* NULL in open mode without a secret */
	size_t secret_len;
	int open;
	pthread_rwlock_t lock; /* protects keys */
	struct gw_keyset *keys;
	/* The key file as last loaded (inode, mtime): gw_auth_sigwait's thread only. */
	dev_t dev;
	ino_t ino;
	struct timespec mtime;
};

/* 1 when the key file is not the one last loaded (edited in place, or renamed over); records
 * what it is now. A file that cannot be stat'ed counts as unchanged (a reload would fail). */
static int keys_changed(struct gw_auth *a)
{
	struct stat st;
	if (stat(a->keys_path, &st))
		return 0;
	int ch = st.st_dev != a->dev || st.st_ino != a->ino ||
		 st.st_mtim.tv_sec != a->mtime.tv_sec || st.st_mtim.tv_nsec != a->mtime.tv_nsec;
	a->dev = st.st_dev;
	a->ino = st.st_ino;
	a->mtime = st.st_mtim;
	return ch;
}

static int key_char(int c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '~' || c == '+' || c == '/' || c == '=' || c == '-';
}

static int tenant_char(int c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '@' || c == '-';
}

static void digest(const char *key, size_t len, uint8_t out[SHA256_DIGEST_LENGTH])
{
	SHA256((const unsigned char *)key, len, out);
}

void gw_keyset_free(struct gw_keyset *k)
{
	if (!k)
		return;
	OPENSSL_cleanse(k->k, sizeof(*k->k) * (size_t)k->cap);
	free(k->k);
	free(k);
}

int gw_keyset_count(const struct gw_keyset *k)
{
	return k ? k->n : 0;
}

/* Splits one line (no newline) into key and tenant. 0 for an entry, 1 for a blank or comment
 * line, -EINVAL with err filled. */
static int parse_line(const char *s, size_t len, struct gw_key *out, char *err, size_t errlen,
		      int lineno)
{
	size_t i = 0;
	while (i < len && (s[i] == ' ' || s[i] == '\t'))
		i++;
	if (i == len || s[i] == '#')
		return 1;
	size_t k0 = i;
	while (i < len && key_char((unsigned char)s[i]))
		i++;
	size_t klen = i - k0;
	if (i < len && s[i] != ' ' && s[i] != '\t') {
		snprintf(err, errlen, "line %d: a key may hold only A-Z a-z 0-9 . _ ~ + / = -",
			 lineno);
		return -EINVAL;
	}
	if (klen < GW_KEY_MIN || klen > GW_KEY_MAX) {
		snprintf(err, errlen, "line %d: a key is %d to %d characters (this one: %zu)",
			 lineno, GW_KEY_MIN, GW_KEY_MAX, klen);
		return -EINVAL;
	}
	while (i < len && (s[i] == ' ' || s[i] == '\t'))
		i++;
	size_t t0 = i;
	while (i < len && tenant_char((unsigned char)s[i]))
		i++;
	size_t tlen = i - t0;
	while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
		i++;
	if (i != len || tlen == 0 || tlen > GW_TENANT_MAX) {
		snprintf(err, errlen,
			 "line %d: want '<key> <tenant>', a tenant of 1 to %d characters of "
			 "A-Z a-z 0-9 . _ @ -",
			 lineno, GW_TENANT_MAX);
		return -EINVAL;
	}
	digest(s + k0, klen, out->digest);
	memcpy(out->tenant, s + t0, tlen);
	out->tenant[tlen] = 0;
	out->line = lineno;
	return 0;
}

int gw_keyset_parse(const char *text, size_t len, struct gw_keyset **out, char *err, size_t errlen)
{
	struct gw_keyset *ks = calloc(1, sizeof(*ks));
	if (!ks)
		return -ENOMEM;
	int lineno = 0, rc = 0;
	for (size_t off = 0; off < len && !rc;) {
		const char *nl = memchr(text + off, '\n', len - off);
		size_t ll = nl ? (size_t)(nl - (text + off)) : len - off;
		lineno++;
		struct gw_key k;
		int r = parse_line(text + off, ll, &k, err, errlen, lineno);
		off += ll + (nl ? 1 : 0);
		if (r < 0) {
			rc = r;
			break;
		}
		if (r)
			continue;
		for (int i = 0; i < ks->n; i++)
			if (!memcmp(ks->k[i].digest, k.digest, sizeof(k.digest))) {
				snprintf(err, errlen, "line %d: the key of line %d again", lineno,
					 ks->k[i].line);
				rc = -EINVAL;
			}
		if (rc)
			break;
		if (ks->n == ks->cap) {
			int cap = ks->cap ? ks->cap * 2 : 16;
			struct gw_key *nk = calloc((size_t)cap, sizeof(*nk));
			if (!nk) {
				rc = -ENOMEM;
				break;
			}
			if (ks->n)
				memcpy(nk, ks->k, sizeof(*nk) * (size_t)ks->n);
			OPENSSL_cleanse(ks->k, sizeof(*ks->k) * (size_t)ks->cap);
			free(ks->k);
			ks->k = nk;
			ks->cap = cap;
		}
		ks->k[ks->n++] = k;
	}
	if (rc) {
		gw_keyset_free(ks);
		return rc;
	}
	*out = ks;
	return 0;
}

/* Reads a whole small file. 0 and a malloc'd *buf (NUL-terminated) of *len bytes. */
static int read_file(const char *path, size_t max, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -errno;
	char *b = malloc(max + 1);
	if (!b) {
		fclose(f);
		return -ENOMEM;
	}
	size_t n = fread(b, 1, max + 1, f);
	int bad = ferror(f);
	fclose(f);
	if (bad || n > max) {
		OPENSSL_cleanse(b, n);
		free(b);
		return bad ? -EIO : -EFBIG;
	}
	b[n] = 0;
	*buf = b;
	*len = n;
	return 0;
}

static int load_keys(const char *path, struct gw_keyset **out)
{
	char *text;
	size_t len;
	int rc = read_file(path, KEYFILE_MAX, &text, &len);
	if (rc) {
		klog_error("API key file %s: %s", path, strerror(-rc));
		return rc == -EFBIG ? -EINVAL : rc;
	}
	char err[160] = "";
	rc = gw_keyset_parse(text, len, out, err, sizeof(err));
	OPENSSL_cleanse(text, len);
	free(text);
	if (rc == -EINVAL)
		klog_error("API key file %s: %s", path, err);
	else if (!rc && (*out)->n == 0)
		klog_warn("API key file %s holds no key: every /v1 request gets 401", path);
	return rc;
}

static int load_secret(const char *path, uint8_t **out, size_t *olen)
{
	char *b;
	size_t n;
	int rc = read_file(path, SECRET_MAX + 2, &b, &n);
	if (rc) {
		klog_error("tenant secret %s: %s", path, strerror(-rc));
		return rc == -EFBIG ? -EINVAL : rc;
	}
	if (n && b[n - 1] == '\n')
		n--;
	if (n && b[n - 1] == '\r')
		n--;
	if (n < SECRET_MIN || n > SECRET_MAX) {
		klog_error("tenant secret %s: %zu bytes, want %d to %d", path, n, SECRET_MIN,
			   SECRET_MAX);
		OPENSSL_cleanse(b, n);
		free(b);
		return -EINVAL;
	}
	*out = (uint8_t *)b;
	*olen = n;
	return 0;
}

int gw_auth_create(const struct gw_auth_opts *o, struct gw_auth **out)
{
	if (o->open ? o->keys_path != NULL : (!o->keys_path || !o->secret_path))
		return -EINVAL;
	struct gw_auth *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->open = o->open;
	pthread_rwlock_init(&a->lock, NULL);
	int rc = 0;
	if (o->secret_path)
		rc = load_secret(o->secret_path, &a->secret, &a->secret_len);
	if (!rc && o->keys_path && !(a->keys_path = strdup(o->keys_path)))
		rc = -ENOMEM;
	if (!rc && o->keys_path) {
		keys_changed(a); /* before the read: a change during it is seen next time */
		rc = load_keys(o->keys_path, &a->keys);
	}
	if (rc) {
		gw_auth_destroy(a);
		return rc;
	}
	*out = a;
	return 0;
}

void gw_auth_destroy(struct gw_auth *a)
{
	if (!a)
		return;
	pthread_rwlock_destroy(&a->lock);
	gw_keyset_free(a->keys);
	if (a->secret) {
		OPENSSL_cleanse(a->secret, a->secret_len);
		free(a->secret);
	}
	free(a->keys_path);
	free(a);
}

int gw_auth_reload(struct gw_auth *a)
{
	if (a->open)
		return 0;
	struct gw_keyset *ks = NULL;
	int rc = load_keys(a->keys_path, &ks);
	if (rc) {
		klog_error("API keys not reloaded: the %d keys in force stay", gw_auth_nkeys(a));
		return rc;
	}
	pthread_rwlock_wrlock(&a->lock);
	struct gw_keyset *old = a->keys;
	a->keys = ks;
	pthread_rwlock_unlock(&a->lock);
	gw_keyset_free(old);
	klog_info("API keys reloaded from %s: %d keys", a->keys_path, ks->n);
	return 0;
}

int gw_auth_is_open(const struct gw_auth *a)
{
	return a->open;
}

int gw_auth_nkeys(struct gw_auth *a)
{
	pthread_rwlock_rdlock(&a->lock);
	int n = gw_keyset_count(a->keys);
	pthread_rwlock_unlock(&a->lock);
	return n;
}

int gw_auth_check(struct gw_auth *a, const char *authorization, char *tenant)
{
	if (a->open) {
		tenant[0] = 0;
		return 0;
	}
	/* RFC 6750: "Bearer" is case-insensitive, then one or more spaces, then the token. */
	if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
		return -EACCES;
	const char *key = authorization + 7;
	while (*key == ' ')
		key++;
	size_t klen = strlen(key);
	while (klen && (key[klen - 1] == ' ' || key[klen - 1] == '\t'))
		klen--;
	if (klen < GW_KEY_MIN || klen > GW_KEY_MAX)
		return -EACCES;
	uint8_t d[SHA256_DIGEST_LENGTH];
	digest(key, klen, d);
	int found = -1;
	pthread_rwlock_rdlock(&a->lock);
	/* No early exit: the scan takes the same time wherever (or whether) the key is. */
	for (int i = 0; i < a->keys->n; i++)
		if (CRYPTO_memcmp(a->keys->k[i].digest, d, sizeof(d)) == 0)
			found = i;
	if (found >= 0)
		memcpy(tenant, a->keys->k[found].tenant, GW_TENANT_MAX + 1);
	pthread_rwlock_unlock(&a->lock);
	return found >= 0 ? 0 : -EACCES;
}

int gw_auth_salt(const struct gw_auth *a, const char *tenant, const char *client_salt, char *out,
		 const char **salt)
{
	if (!a->secret) {
		*salt = client_salt;
		return 0;
	}
	size_t tl = strlen(tenant), sl = client_salt ? strlen(client_salt) : 0;
	if (tl > GW_TENANT_MAX || sl > GW_CLIENT_SALT_MAX)
		return -EINVAL;
	unsigned char msg[GW_TENANT_MAX + 1 + GW_CLIENT_SALT_MAX];
	memcpy(msg, tenant, tl);
	size_t ml = tl;
	if (client_salt) {
		msg[ml++] = 0;
		memcpy(msg + ml, client_salt, sl);
		ml += sl;
	}
	uint8_t mac[EVP_MAX_MD_SIZE];
	unsigned int maclen = 0;
	if (!HMAC(EVP_sha256(), a->secret, (int)a->secret_len, msg, ml, mac, &maclen) ||
	    maclen != 32)
		return -ENOMEM;
	static const char hx[] = "0123456789abcdef";
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hx[mac[i] >> 4];
		out[2 * i + 1] = hx[mac[i] & 15];
	}
	out[64] = 0;
	*salt = out;
	return 0;
}

int gw_auth_from_options(const char *keys, const char *secret, int open, const char *prog,
			 struct gw_auth **out)
{
	keys = keys && keys[0] ? keys : NULL;
	secret = secret && secret[0] ? secret : NULL;
	if (open && keys) {
		fprintf(stderr, "%s: --open-gateway and --api-keys exclude each other\n", prog);
		return -EINVAL;
	}
	if (!open && (!keys || !secret)) {
		fprintf(stderr,
			"%s: give --api-keys FILE and --tenant-secret-file FILE, or run an open "
			"gateway with --open-gateway; see docs/serving.md\n",
			prog);
		return -EINVAL;
	}
	struct gw_auth_opts o = {.keys_path = keys, .secret_path = secret, .open = open};
	int rc = gw_auth_create(&o, out);
	if (rc) {
		fprintf(stderr, "%s: cannot load the API keys or tenant secret: %s\n", prog,
			strerror(-rc));
		return rc;
	}
	if (open)
		klog_warn("OPEN GATEWAY (--open-gateway): no API keys, anyone who reaches the port "
			  "may call /v1; %s",
			  secret ? "one tenant, salts derived from the tenant secret"
				 : "the client's cache_salt / user is used as sent");
	else
		klog_info("API keys: %d from %s; cache salts derived per tenant",
			  gw_auth_nkeys(*out), keys);
	return 0;
}

int gw_auth_sigwait(struct gw_auth *a, const sigset_t *sigs)
{
	for (;;) {
		struct timespec tick = {1, 0};
		int sig = sigtimedwait(sigs, NULL, &tick);
		if (sig < 0) {
			/* each second: reload a key file that changed (a failed parse is logged
			 * once per change, and the keys in force stay) */
			if (errno == EAGAIN && !a->open && keys_changed(a))
				gw_auth_reload(a);
			continue;
		}
		if (sig != SIGHUP)
			return sig;
		if (!a->open)
			keys_changed(a);
		gw_auth_reload(a);
	}
}
