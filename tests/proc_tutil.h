/* proc_tutil — what the tests that run real daemons (kvinfer workers and gateways) share:
 * starting and stopping them by pid, waiting for the port they write, reading one value of a
 * /metrics page, and checking their logs for sanitizer reports. */
#ifndef KVFS_PROC_TUTIL_H
#define KVFS_PROC_TUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

void ptu_sleep_ms(int ms);
/* Makes the scratch directory /tmp/<name>.XXXXXX into dir (dn bytes) and writes the path of
 * the build's kvinfer (under $KVFS_BUILD_DIR, else ./build) into bin (bn bytes). 0 or -1. */
int ptu_scratch(const char *name, char *dir, size_t dn, char *bin, size_t bn);
/* Writes the synthetic small model to model, and its vision projector to mmproj unless that is
 * NULL, with the build's kvinfer-synth (stderr to dir/synth.log). 0, or -1 when it failed. */
int ptu_synth(const char *dir, const char *model, const char *mmproj);
/* Writes line and a newline to path (a secret file). 0 or -1. */
int ptu_write_line(const char *path, const char *line);
/* Forks and execs argv[0] with stderr to log. The child's pid, or -1. */
pid_t ptu_spawn(char *const argv[], const char *log);
/* SIGTERM to *p and waits for it; *p becomes -1. No-op for *p <= 0. */
void ptu_stop(pid_t *p);
/* The port a daemon wrote to path (--port-file), waiting up to 15 s; 0 if none came. */
uint16_t ptu_wait_port(const char *path);
/* Waits for the ports of n daemons, written to dir/stem0 .. dir/stem<n-1>, into ports[0..n).
 * 0, or -1 when one did not come. */
int ptu_wait_ports(const char *dir, const char *stem, int n, uint16_t *ports);
/* The address "host:port" a daemon wrote to path (--metrics-addr-file), waiting up to 5 s:
 * into addr (n bytes, without the newline) and its port returned; 0 if none came. */
uint16_t ptu_wait_addr(const char *path, char *addr, size_t n);
/* Starts `kvinfer gateway` (bin: the kvinfer binary) in front of the prefill worker at
 * 127.0.0.1:pport and the decode worker at 127.0.0.1:dport: --open-gateway, --secret-file
 * sec, any port, written to pf, stderr to log, then extra (NULL-terminated, may be NULL; 16 at
 * most). The pid, or -1. */
pid_t ptu_gateway_at(const char *bin, const char *pf, const char *log, uint16_t pport,
		     uint16_t dport, const char *sec, const char *const *extra);
/* Starts `kvinfer encode` (bin) with the tower mmproj, kv dir kv and secret sec on one
 * thread: any kvw port, written to pf; /metrics on any loopback port, its address written to
 * mf (ptu_wait_addr); stderr to log; then extra (NULL-terminated, may be NULL; 16 at most).
 * The pid, or -1. */
pid_t ptu_encoder(const char *bin, const char *mmproj, const char *kv, const char *sec,
		  const char *pf, const char *mf, const char *log, const char *const *extra);
/* Starts `kvinfer serve` (bin) of model with the vision tower mmproj and kv dir kv, as the
 * vision tests run it: one thread, B = 16, a 512-token context, any port (written to pf), no
 * API keys (--open-gateway); stderr to log; then extra (as ptu_encoder's). The pid, or -1. */
pid_t ptu_serve_vision(const char *bin, const char *model, const char *mmproj, const char *kv,
		       const char *pf, const char *log, const char *const *extra);
/* ptu_gateway_at for gateway number i of a group: its port in dir/gport<i>, its stderr in
 * dir/glog<i> (ptu_wait_ports, ptu_assert_healthy). */
pid_t ptu_gateway(const char *bin, const char *dir, int i, uint16_t pport, uint16_t dport,
		  const char *sec, const char *const *extra);
/* cmocka assertions: workers w[0..nw) and gateways g[0..ng) still run, and none of their logs
 * (dir/wlog<i>, dir/glog<i>) has a sanitizer report. */
void ptu_assert_healthy(const char *dir, const pid_t *w, int nw, const pid_t *g, int ng);
/* A group's teardown: ptu_stop on a[0..na) then b[0..nb) (gateways before the workers they
 * call), then removes dir unless KVFS_TEST_KEEP is set (then it says where it is). 0 or -1. */
int ptu_finish(const char *dir, pid_t *a, int na, pid_t *b, int nb);
/* The value of the sample "name value" (name with its labels) of the /metrics page at
 * 127.0.0.1:port, or -1. A page that is not well-formed exposition text (prom_parse.h) fails
 * the running cmocka test. */
double ptu_metric(uint16_t port, const char *name);
/* 1 when the file at path has no sanitizer report (ASan, UBSan, LSan), 0 when it has one or
 * cannot be read. */
int ptu_log_clean(const char *path);
/* 1 when some line of the file at path contains text, else 0. */
int ptu_log_has(const char *path, const char *text);

#endif
