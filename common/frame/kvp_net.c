/* Sockets and framed I/O. Loopback-or-LAN TCP; frames are written with one writev. */
#include "kvp_frame.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

int kvp_addr_parse(const char *addr, char *host, size_t hostcap, uint16_t *port)
{
	if (!addr)
		return -EINVAL;
	const char *colon = strrchr(addr, ':');
	if (!colon || colon == addr || (size_t)(colon - addr) >= hostcap)
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long p = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || p > 65535)
		return -EINVAL;
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = 0;
	if (strcmp(host, "localhost") == 0)
		snprintf(host, hostcap, "127.0.0.1");
	struct in_addr ia;
	if (inet_pton(AF_INET, host, &ia) != 1)
		return -EINVAL;
	*port = (uint16_t)p;
	return 0;
}

static int fill_sa(const char *host, uint16_t port, struct sockaddr_in *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons(port);
	if (strcmp(host, "localhost") == 0)
		host = "127.0.0.1";
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

int kvp_listen(const char *host, uint16_t port, uint16_t *bound)
{
	struct sockaddr_in sa;
	if (fill_sa(host, port, &sa))
		return -EINVAL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	socklen_t sl = sizeof(sa);
	getsockname(fd, (struct sockaddr *)&sa, &sl);
	if (bound)
		*bound = ntohs(sa.sin_port);
	return fd;
}

static void tune(int fd)
{
	int one = 1, buf = 4 << 20;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

int kvp_connect(const char *addr, int timeout_ms)
{
	char host[KVP_ADDR_MAX];
	uint16_t port;
	struct sockaddr_in sa;
	if (kvp_addr_parse(addr, host, sizeof(host), &port) || fill_sa(host, port, &sa))
		return -EINVAL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	tune(fd);
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	if (rc < 0 && errno != EINPROGRESS) {
		rc = -errno;
		goto fail;
	}
	if (rc < 0) {
		struct pollfd pfd = {.fd = fd, .events = POLLOUT};
		rc = poll(&pfd, 1, timeout_ms);
		if (rc == 0) {
			rc = -ETIMEDOUT;
			goto fail;
		}
		int err = 0;
		socklen_t el = sizeof(err);
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
		if (rc < 0 || err) {
			rc = err ? -err : -errno;
			goto fail;
		}
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
fail:
	close(fd);
	return rc;
}

int kvp_send(int fd, struct kvp_hdr *h, const void *body, size_t body_len, const void *bulk,
	     size_t bulk_len)
{
	if (body_len + bulk_len > UINT32_MAX)
		return -EMSGSIZE;
	uint8_t hb[KVP_HDR_SIZE];
	h->magic = KVP_MAGIC;
	h->version = KVP_VERSION;
	h->reserved = 0;
	h->len = (uint32_t)(body_len + bulk_len);
	kvp_hdr_encode(h, hb);
	struct iovec iov[3] = {
	    {hb, sizeof(hb)}, {(void *)body, body_len}, {(void *)bulk, bulk_len}};
	struct iovec *v = iov;
	int n = 3;
	while (n > 0) {
		/* MSG_NOSIGNAL: a peer that hung up is an error return, never a SIGPIPE. */
		struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)n};
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		while (n > 0 && (size_t)w >= v->iov_len) {
			w -= (ssize_t)v->iov_len;
			v++;
			n--;
		}
		if (n > 0) {
			v->iov_base = (char *)v->iov_base + w;
			v->iov_len -= (size_t)w;
		}
	}
	return 0;
}

static int read_full(int fd, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r == 0)
			return -ECONNRESET;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return -ETIMEDOUT;
			return -errno;
		}
		got += (size_t)r;
	}
	return 0;
}

int kvp_recv(int fd, struct kvp_hdr *h, uint8_t **body, uint32_t max_body)
{
	uint8_t hb[KVP_HDR_SIZE];
	*body = NULL;
	int rc = read_full(fd, hb, sizeof(hb));
	if (rc)
		return rc;
	rc = kvp_hdr_decode(hb, h, max_body);
	if (rc)
		return rc;
	if (h->len == 0)
		return 0;
	uint8_t *b = malloc(h->len);
	if (!b)
		return -ENOMEM;
	rc = read_full(fd, b, h->len);
	if (rc) {
		free(b);
		return rc;
	}
	*body = b;
	return 0;
}
