/* libFuzzer: the gateway's API key file parser (engine/serve/gw_auth), and Authorization header
 * values checked against a small key set. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gw_auth.h"

static struct gw_auth *auth_once(void)
{
	static struct gw_auth *a;
	if (a)
		return a;
	char keys[] = "/tmp/fuzz_gw_keys.XXXXXX", sec[] = "/tmp/fuzz_gw_sec.XXXXXX";
	int fk = mkstemp(keys), fs = mkstemp(sec);
	if (fk < 0 || fs < 0)
		abort();
	static const char kt[] = "fuzz-key-0123456789abcdef alice\nfuzz-key-bbbbbbbbbbbbbbbb bob\n";
	static const char st[] = "fuzz-tenant-secret-0123456789\n";
	if (write(fk, kt, sizeof(kt) - 1) < 0 || write(fs, st, sizeof(st) - 1) < 0)
		abort();
	close(fk);
	close(fs);
	struct gw_auth_opts o = {.keys_path = keys, .secret_path = sec};
	if (gw_auth_create(&o, &a))
		abort();
	unlink(keys);
	unlink(sec);
	return a;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gw_keyset *ks = NULL;
	char err[160];
	if (gw_keyset_parse((const char *)data, size, &ks, err, sizeof(err)) == 0)
		gw_keyset_free(ks);
	char *h = malloc(size + 1);
	if (!h)
		return 0;
	memcpy(h, data, size);
	h[size] = 0;
	char tenant[GW_TENANT_MAX + 1], salt[GW_SALT_HEX];
	const char *s;
	if (gw_auth_check(auth_once(), h, tenant) == 0 &&
	    gw_auth_salt(auth_once(), tenant, strlen(h) <= GW_CLIENT_SALT_MAX ? h : NULL, salt, &s))
		abort();
	free(h);
	return 0;
}
