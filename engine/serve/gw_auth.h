/* gw_auth — who may use the gateway, and whose cache a request may touch.
 *
 * Tenants are API keys. A key file maps each key to a tenant name, one per line:
 *
 *     # comment; blank lines are ignored
 *     <key> <tenant>
 *
 * key: 16..128 characters of [A-Za-z0-9._~+/=-]; tenant: 1..64 characters of
 * [A-Za-z0-9._@-]. A tenant may have several keys (rotation); a key appears once. A request
 * proves its tenant with `Authorization: Bearer <key>`. The file is reread on SIGHUP and when it
 * changes (gw_auth_sigwait).
 *
 * A tenant's cache salt is derived on the server, never taken from the client:
 *     salt = hex(HMAC-SHA256(secret, tenant))                      no cache_salt / user
 *     salt = hex(HMAC-SHA256(secret, tenant || 0x00 || cache_salt))  otherwise
 * so a client's cache_salt only narrows within its own tenant. The secret is read from a file
 * (its bytes, a trailing newline stripped, 16..4096 bytes) and must stay the same across
 * restarts for the cache to keep hitting.
 *
 * Open mode (the operator's explicit choice): no keys; every request is the tenant "" and, with
 * no secret, the client's salt is used as it is (the behaviour before keys existed).
 *
 * Threading: gw_auth_check / gw_auth_salt may run on any thread while gw_auth_reload swaps the
 * key set (a read-write lock; a check holds it for one scan of the keys).
 */
#ifndef KVFS_GW_AUTH_H
#define KVFS_GW_AUTH_H

#include <signal.h>
#include <stddef.h>

#define GW_TENANT_MAX	   64 /* longest tenant name, without its NUL */
#define GW_KEY_MIN	   16
#define GW_KEY_MAX	   128
#define GW_SALT_HEX	   65  /* a derived salt: 64 hex digits and a NUL */
#define GW_CLIENT_SALT_MAX 255 /* = OAI_MAX_SALT */

struct gw_auth;
struct gw_keyset;

struct gw_auth_opts {
	const char *keys_path;	 /* the key file; NULL only in open mode */
	const char *secret_path; /* the salt secret; NULL only in open mode */
	int open;		 /* 1: no keys, anyone may call (keys_path must be NULL) */
};

/* Loads the key file and the secret. 0, -EINVAL (a bad option combination or a bad file: a log
 * line names the file, line and problem), -ENOENT / -EACCES (cannot read), -ENOMEM. */
int gw_auth_create(const struct gw_auth_opts *o, struct gw_auth **out);
void gw_auth_destroy(struct gw_auth *a);
/* Re-reads the key file. On any error the old keys stay in force and the error is returned
 * (and logged). In open mode, 0 and nothing changes. */
int gw_auth_reload(struct gw_auth *a);
int gw_auth_is_open(const struct gw_auth *a);
/* Number of keys in force. */
int gw_auth_nkeys(struct gw_auth *a);

/* Checks an Authorization header value (NULL when absent). 0 and the tenant's name in
 * tenant[GW_TENANT_MAX + 1]; -EACCES for a missing, malformed or unknown key. Every key is
 * compared in constant time, so the time taken does not depend on which key nearly matched. */
int gw_auth_check(struct gw_auth *a, const char *authorization, char *tenant);

/* The salt a request of tenant with the client's cache_salt (NULL = none) uses: 0 and *salt
 * pointing at out[GW_SALT_HEX] (64 hex digits), or at client_salt itself (possibly NULL) in
 * open mode without a secret. -EINVAL when tenant or client_salt is longer than its maximum,
 * -ENOMEM when OpenSSL fails. */
int gw_auth_salt(const struct gw_auth *a, const char *tenant, const char *client_salt, char *out,
		 const char **salt);

/* ---- for the daemons' main ---- */
/* Builds the gateway's gw_auth from its options (--api-keys, --tenant-secret-file,
 * --open-gateway): keys need a secret; open mode excludes keys; neither is refused, so a
 * gateway is never open by accident. Open mode is logged as a warning. Messages go to stderr
 * prefixed with prog. 0 or a negative errno. */
int gw_auth_from_options(const char *keys, const char *secret, int open, const char *prog,
			 struct gw_auth **out);
/* Waits for a signal of sigs (which must hold SIGHUP and be blocked in every thread),
 * reloading the keys on each SIGHUP and, checked every second, whenever the key file's mtime or
 * inode changed (an edit, or a new file renamed over it); returns the first other signal. */
int gw_auth_sigwait(struct gw_auth *a, const sigset_t *sigs);

/* ---- the key file parser (pure; the fuzz target's entry) ---- */
/* Parses len bytes of key-file text. 0 and *out (free with gw_keyset_free); -EINVAL with a
 * message naming the line in err; -ENOMEM. */
int gw_keyset_parse(const char *text, size_t len, struct gw_keyset **out, char *err, size_t errlen);
void gw_keyset_free(struct gw_keyset *k);
int gw_keyset_count(const struct gw_keyset *k);

#endif
