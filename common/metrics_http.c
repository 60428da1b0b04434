/* /metrics over HTTP (libmicrohttpd, one internal polling thread: scrapes are rare and small). */
#define KVFS_LOG_TAG "metrics"
#include "log.h"
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if MHD_VERSION >= 0x00097002
typedef enum MHD_Result mhd_ret;
#else
typedef int mhd_ret;
#endif

struct met_http {
	struct met_reg *r;
	struct MHD_Daemon *d;
	uint16_t port;
};

static mhd_ret send_static(struct MHD_Connection *c, unsigned code, const char *text)
{
	struct MHD_Response *rsp =
	    MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	if (!rsp)
		return MHD_NO;
	MHD_add_response_header(rsp, "Content-Type", "text/plain; charset=utf-8");
	mhd_ret rc = MHD_queue_response(c, code, rsp);
	MHD_destroy_response(rsp);
	return rc;
}

static mhd_ret handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
		       const char *version, const char *upload, size_t *upload_size, void **state)
{
	(void)version, (void)upload;
	struct met_http *h = cls;
	if (!*state) { /* first call of a request: headers only */
		*state = h;
		return MHD_YES;
	}
	if (*upload_size) { /* a body is not expected; drop it */
		*upload_size = 0;
		return MHD_YES;
	}
	int vllm = strcmp(url, "/metrics/vllm") == 0;
	if (strcmp(url, "/metrics") != 0 && !vllm)
		return send_static(c, MHD_HTTP_NOT_FOUND, "not found: try /metrics\n");
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return send_static(c, MHD_HTTP_METHOD_NOT_ALLOWED, "use GET\n");
	char *text = NULL;
	size_t len = 0;
	int rc = met_render_page(h->r, vllm ? MET_PAGE_NS : MET_PAGE_PLAIN, &text, &len);
	if (rc) {
		klog_warn("cannot render metrics: %s", strerror(-rc));
		return send_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot render metrics\n");
	}
	struct MHD_Response *rsp =
	    MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!rsp) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(rsp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	mhd_ret ret = MHD_queue_response(c, MHD_HTTP_OK, rsp);
	MHD_destroy_response(rsp);
	return ret;
}

/* "HOST:PORT", HOST an IPv4 literal or localhost. */
static int parse_listen(const char *s, struct sockaddr_in *sa)
{
	const char *colon = strrchr(s, ':');
	if (!colon || colon == s || (size_t)(colon - s) >= 64)
		return -EINVAL;
	char host[64];
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = 0;
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (!colon[1] || *end || port < 0 || port > 65535)
		return -EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (strcmp(host, "localhost") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

int met_http_start(struct met_reg *r, const char *listen, struct met_http **out)
{
	struct sockaddr_in sa;
	if (!r || !listen || parse_listen(listen, &sa))
		return -EINVAL;
	struct met_http *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->r = r;
	h->d = MHD_start_daemon(MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
				0, NULL, NULL, handler, h, MHD_OPTION_SOCK_ADDR, &sa,
				MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT,
				30u, MHD_OPTION_END);
	if (!h->d) {
		free(h);
		return -EADDRINUSE;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = di ? di->port : ntohs(sa.sin_port);
	*out = h;
	return 0;
}

uint16_t met_http_port(const struct met_http *h)
{
	return h ? h->port : 0;
}

void met_http_stop(struct met_http *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->d);
	free(h);
}

static int write_file_atomic(const char *path, const char *text)
{
	char tmp[4096];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -errno;
	int ok = fputs(text, f) >= 0;
	ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
	ok &= fclose(f) == 0;
	if (!ok || rename(tmp, path)) {
		int e = errno ? -errno : -EIO;
		unlink(tmp);
		return e;
	}
	return 0;
}

int met_http_serve(struct met_reg *r, const char *listen, const char *addr_file,
		   struct met_http **out)
{
	*out = NULL;
	if (!listen || !*listen)
		return 0;
	struct met_http *h;
	int rc = met_http_start(r, listen, &h);
	if (rc) {
		klog_error("cannot serve metrics on %s: %s", listen, strerror(-rc));
		return rc;
	}
	char addr[96];
	const char *colon = strrchr(listen, ':');
	int hl = (int)(colon - listen);
	if (hl == 7 && strncmp(listen, "0.0.0.0", 7) == 0)
		snprintf(addr, sizeof(addr), "127.0.0.1:%u", h->port);
	else
		snprintf(addr, sizeof(addr), "%.*s:%u", hl > 64 ? 64 : hl, listen, h->port);
	klog_info("metrics on http://%s/metrics", addr);
	if (addr_file && *addr_file) {
		char line[100];
		snprintf(line, sizeof(line), "%s\n", addr);
		rc = write_file_atomic(addr_file, line);
		if (rc) {
			klog_error("cannot write %s: %s", addr_file, strerror(-rc));
			met_http_stop(h);
			return rc;
		}
	}
	*out = h;
	return 0;
}
