/* http_tutil — a minimal HTTP client for the gateway tests (test_gw, test_serve): one request per
 * connection, the response read until the server closes it. Loopback only.
 *
 * version 0 sends HTTP/1.0 (the server then ends the body at EOF, no chunked encoding); version 1
 * sends HTTP/1.1 with "Connection: close" (streamed bodies arrive chunked). */
#ifndef KVFS_HTTP_TUTIL_H
#define KVFS_HTTP_TUTIL_H

#include <stdint.h>

/* A connected socket to 127.0.0.1:port, or -1. */
int htu_connect(uint16_t port);
/* Writes the request (Content-Type application/json; body may be NULL). 0, or -1 when the
 * connection failed part-way. */
int htu_send(int fd, int version, const char *method, const char *path, const char *body);
/* htu_send with extra header lines (each ending in \r\n; NULL for none). */
int htu_send_h(int fd, int version, const char *method, const char *path, const char *headers,
	       const char *body);
/* Reads the response until EOF and closes fd. Returns the status code (-1 if none) and sets *out
 * to the body (malloc'd; the caller frees). */
int htu_recv(int fd, char **out);
/* htu_connect + htu_send + htu_recv. -1 (and *out NULL) when the server cannot be reached. */
int htu_request(uint16_t port, int version, const char *method, const char *path, const char *body,
		char **out);
int htu_request_h(uint16_t port, int version, const char *method, const char *path,
		  const char *headers, const char *body, char **out);

#endif
