#define KVFS_LOG_TAG "gateway"
#include "gw_net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"

#define PEM_MAX (1u << 20)

/* One source address's open connections. A linear table: at most total + reserve entries are
 * live, and a scan of a few hundred is far cheaper than the accept it guards. */
struct gw_src {
	uint8_t addr[16]; /* IPv4 mapped into the first 4 bytes; len says which */
	uint8_t len;
	unsigned n;
};

struct gw_net {
	unsigned total, per_address;
	struct met_counter *refused_addr, *refused_total;
	struct met_gauge *open;
	pthread_mutex_t mu; /* protects everything below */
	unsigned nopen;
	struct gw_src *src;
	unsigned nsrc, cap;
};

/* A connection's socket_context: its source's key, to find it again when it closes. */
struct gw_sock {
	uint8_t addr[16];
	uint8_t len;
};

static int src_key(const struct sockaddr *sa, socklen_t salen, uint8_t out[16], uint8_t *len,
		   int *loopback)
{
	if (sa->sa_family == AF_INET && salen >= (socklen_t)sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		memcpy(out, &in->sin_addr, 4);
		*len = 4;
		*loopback = out[0] == 127;
		return 0;
	}
	if (sa->sa_family == AF_INET6 && salen >= (socklen_t)sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		memcpy(out, &in6->sin6_addr, 16);
		*len = 16;
		*loopback = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
		return 0;
	}
	return -EAFNOSUPPORT;
}

/* The source's entry, or NULL. Called with mu held. */
static struct gw_src *src_find(struct gw_net *n, const uint8_t *addr, uint8_t len)
{
	for (unsigned i = 0; i < n->nsrc; i++)
		if (n->src[i].len == len && !memcmp(n->src[i].addr, addr, len))
			return &n->src[i];
	return NULL;
}

int gw_net_create(unsigned total, unsigned per_address, struct met_reg *reg, struct gw_net **out)
{
	if (!total || !per_address)
		return -EINVAL;
	struct gw_net *n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->total = total;
	n->per_address = per_address;
	n->cap = total + GW_NET_LOOPBACK_RESERVE;
	n->src = calloc(n->cap, sizeof(*n->src));
	const char *la[] = {"reason", "per_address", NULL}, *lt[] = {"reason", "total", NULL};
	static const char help[] =
	    "Connections closed at accept: their address or the gateway held too many";
	n->refused_addr = met_counter_new(reg, "kvfs_gateway_connections_refused_total", help, la);
	n->refused_total = met_counter_new(reg, "kvfs_gateway_connections_refused_total", help, lt);
	n->open = met_gauge_new(reg, "kvfs_gateway_connections_open",
				"HTTP connections the gateway holds now", NULL);
	if (!n->src || !n->refused_addr || !n->refused_total || !n->open) {
		free(n->src);
		free(n);
		return -ENOMEM;
	}
	pthread_mutex_init(&n->mu, NULL);
	*out = n;
	return 0;
}

void gw_net_destroy(struct gw_net *n)
{
	if (!n)
		return;
	pthread_mutex_destroy(&n->mu);
	free(n->src);
	free(n);
}

unsigned gw_net_mhd_limit(const struct gw_net *n)
{
	return n->total + GW_NET_LOOPBACK_RESERVE;
}

enum MHD_Result gw_net_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	struct gw_net *n = cls;
	uint8_t key[16], len;
	int lo;
	if (src_key(addr, addrlen, key, &len, &lo))
		return MHD_NO;
	pthread_mutex_lock(&n->mu);
	struct gw_src *s = src_find(n, key, len);
	int over_addr = s && s->n >= n->per_address;
	int over_total = n->nopen >= n->total + (lo ? GW_NET_LOOPBACK_RESERVE : 0);
	pthread_mutex_unlock(&n->mu);
	if (over_addr)
		met_counter_add(n->refused_addr, 1);
	else if (over_total)
		met_counter_add(n->refused_total, 1);
	return over_addr || over_total ? MHD_NO : MHD_YES;
}

/* Counting happens here, not in gw_net_accept: MHD may still drop a connection it accepted
 * (out of memory, no thread), and only a started connection is ever closed. The listening
 * thread runs accept and started back to back, so the check and the count do not race. */
void gw_net_notify(void *cls, struct MHD_Connection *c, void **socket_context,
		   enum MHD_ConnectionNotificationCode code)
{
	struct gw_net *n = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
		    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		struct gw_sock *k = calloc(1, sizeof(*k));
		int lo;
		socklen_t sl = ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6
				   ? (socklen_t)sizeof(struct sockaddr_in6)
				   : (socklen_t)sizeof(struct sockaddr_in);
		if (!k || !ci || !ci->client_addr ||
		    src_key(ci->client_addr, sl, k->addr, &k->len, &lo)) {
			free(k);
			*socket_context = NULL; /* uncounted: nothing to undo at close */
			return;
		}
		pthread_mutex_lock(&n->mu);
		struct gw_src *s = src_find(n, k->addr, k->len);
		if (!s && n->nsrc < n->cap) {
			s = &n->src[n->nsrc++];
			memcpy(s->addr, k->addr, k->len);
			s->len = k->len;
			s->n = 0;
		}
		if (s) {
			s->n++;
			n->nopen++;
		}
		pthread_mutex_unlock(&n->mu);
		if (!s) {
			free(k);
			k = NULL;
		} else {
			met_gauge_add(n->open, 1);
		}
		*socket_context = k;
		return;
	}
	struct gw_sock *k = *socket_context;
	if (code != MHD_CONNECTION_NOTIFY_CLOSED || !k)
		return;
	pthread_mutex_lock(&n->mu);
	struct gw_src *s = src_find(n, k->addr, k->len);
	if (s) {
		n->nopen--;
		if (--s->n == 0)
			*s = n->src[--n->nsrc];
	}
	pthread_mutex_unlock(&n->mu);
	if (s)
		met_gauge_add(n->open, -1);
	free(k);
	*socket_context = NULL;
}

static int read_pem(const char *path, const char *what, char **out)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		int e = errno;
		klog_error("TLS %s %s: %s", what, path, strerror(e));
		return -e;
	}
	char *b = malloc(PEM_MAX + 1);
	size_t len = b ? fread(b, 1, PEM_MAX + 1, f) : 0;
	fclose(f);
	if (!b)
		return -ENOMEM;
	if (len == 0 || len > PEM_MAX) {
		klog_error("TLS %s %s: %s", what, path, len ? "larger than 1 MiB" : "empty");
		free(b);
		return -EINVAL;
	}
	b[len] = 0;
	if (!strstr(b, "-----BEGIN ")) {
		klog_error("TLS %s %s: not PEM (no -----BEGIN line)", what, path);
		free(b);
		return -EINVAL;
	}
	*out = b;
	return 0;
}

int gw_net_tls_load(const char *cert_path, const char *key_path, char **cert, char **key)
{
	if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		klog_error("this libmicrohttpd was built without TLS: no --tls-cert");
		return -ENOTSUP;
	}
	*cert = *key = NULL;
	int rc = read_pem(cert_path, "certificate", cert);
	if (!rc && (rc = read_pem(key_path, "key", key))) {
		free(*cert);
		*cert = NULL;
	}
	return rc;
}
