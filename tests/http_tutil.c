#include "http_tutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int htu_connect(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

int htu_send(int fd, int version, const char *method, const char *path, const char *body)
{
	return htu_send_h(fd, version, method, path, NULL, body);
}

int htu_send_h(int fd, int version, const char *method, const char *path, const char *headers,
	       const char *body)
{
	size_t bl = body ? strlen(body) : 0;
	char *req = malloc(bl + 1024);
	if (!req)
		return -1;
	int n = snprintf(req, 1024,
			 "%s %s HTTP/1.%d\r\nHost: x\r\n%s%sContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\n\r\n",
			 method, path, version ? 1 : 0, version ? "Connection: close\r\n" : "",
			 headers ? headers : "", bl);
	if (n < 0 || n >= 1024) {
		free(req);
		return -1;
	}
	if (body)
		memcpy(req + n, body, bl);
	size_t off = 0, total = (size_t)n + bl;
	while (off < total) {
		ssize_t w = write(fd, req + off, total - off);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	free(req);
	return off == total ? 0 : -1;
}

int htu_recv(int fd, char **out)
{
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	ssize_t r;
	while (buf && (r = read(fd, buf + len, cap - len - 1)) > 0) {
		len += (size_t)r;
		if (len + 1 == cap) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb)
				free(buf);
			buf = nb;
		}
	}
	close(fd);
	if (!buf) {
		*out = strdup("");
		return -1;
	}
	buf[len] = 0;
	int status = -1;
	sscanf(buf, "HTTP/1.%*d %d", &status);
	char *b = strstr(buf, "\r\n\r\n");
	*out = strdup(b ? b + 4 : "");
	free(buf);
	return status;
}

int htu_request(uint16_t port, int version, const char *method, const char *path, const char *body,
		char **out)
{
	return htu_request_h(port, version, method, path, NULL, body, out);
}

int htu_request_h(uint16_t port, int version, const char *method, const char *path,
		  const char *headers, const char *body, char **out)
{
	*out = NULL;
	int fd = htu_connect(port);
	if (fd < 0)
		return -1;
	htu_send_h(fd, version, method, path, headers, body);
	return htu_recv(fd, out);
}
