#include "proc_tutil.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "http_tutil.h"
#include "prom_parse.h"

void ptu_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static const char *build_dir(void)
{
	const char *bd = getenv("KVFS_BUILD_DIR");
	return bd ? bd : "build";
}

int ptu_scratch(const char *name, char *dir, size_t dn, char *bin, size_t bn)
{
	snprintf(bin, bn, "%s/bin/kvinfer", build_dir());
	snprintf(dir, dn, "/tmp/%s.XXXXXX", name);
	return mkdtemp(dir) ? 0 : -1;
}

int ptu_synth(const char *dir, const char *model, const char *mmproj)
{
	char synth[512], log[1024];
	snprintf(synth, sizeof(synth), "%s/tools/kvinfer-synth", build_dir());
	snprintf(log, sizeof(log), "%s/synth.log", dir);
	char *argv[] = {synth,	       "--preset", "small",	   "-o",
			(char *)model, "--mmproj", (char *)mmproj, NULL};
	if (!mmproj)
		argv[5] = NULL;
	pid_t p = ptu_spawn(argv, log);
	int st = 0;
	if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st))
		return -1;
	return 0;
}

int ptu_write_line(const char *path, const char *line)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	int bad = fputs(line, f) < 0 || fputc('\n', f) == EOF;
	return fclose(f) || bad ? -1 : 0;
}

pid_t ptu_spawn(char *const argv[], const char *log)
{
	pid_t p = fork();
	if (p == 0) {
		if (!freopen(log, "w", stderr))
			_exit(126);
		execv(argv[0], argv);
		_exit(127);
	}
	return p;
}

void ptu_stop(pid_t *p)
{
	if (*p > 0) {
		kill(*p, SIGTERM);
		waitpid(*p, NULL, 0);
		*p = -1;
	}
}

uint16_t ptu_wait_port(const char *path)
{
	for (int i = 0; i < 300; i++) {
		FILE *f = fopen(path, "r");
		unsigned p = 0;
		int ok = f && fscanf(f, "%u", &p) == 1;
		if (f)
			fclose(f);
		if (ok && p && p < 65536)
			return (uint16_t)p;
		ptu_sleep_ms(50);
	}
	return 0;
}

int ptu_wait_ports(const char *dir, const char *stem, int n, uint16_t *ports)
{
	char pf[1024];
	for (int i = 0; i < n; i++) {
		snprintf(pf, sizeof(pf), "%s/%s%d", dir, stem, i);
		if (!(ports[i] = ptu_wait_port(pf)))
			return -1;
	}
	return 0;
}

uint16_t ptu_wait_addr(const char *path, char *addr, size_t n)
{
	addr[0] = 0;
	for (int i = 0; i < 100 && !addr[0]; i++) {
		FILE *f = fopen(path, "r");
		if (f) {
			if (!fgets(addr, (int)n, f))
				addr[0] = 0;
			fclose(f);
		}
		if (!addr[0])
			ptu_sleep_ms(50);
	}
	addr[strcspn(addr, "\n")] = 0;
	char *colon = strrchr(addr, ':');
	return colon ? (uint16_t)atoi(colon + 1) : 0;
}

/* Appends extra (NULL-terminated, may be NULL) to argv[0..n) (room for cap entries and the
 * NULL) and spawns it with stderr to log. The pid, or -1 (extra too long). */
static pid_t spawn_plus(char **argv, int n, int cap, const char *const *extra, const char *log)
{
	for (int j = 0; extra && extra[j]; j++)
		if (n < cap)
			argv[n++] = (char *)extra[j];
		else
			return -1;
	argv[n] = NULL;
	return ptu_spawn(argv, log);
}

pid_t ptu_gateway_at(const char *bin, const char *pf, const char *log, uint16_t pport,
		     uint16_t dport, const char *sec, const char *const *extra)
{
	enum { NFIXED = 13, NALL = NFIXED + 16 };
	char pl[64], dl[64];
	snprintf(pl, sizeof(pl), "127.0.0.1:%u", pport);
	snprintf(dl, sizeof(dl), "127.0.0.1:%u", dport);
	char *argv[NALL + 1] = {
	    (char *)bin, "gateway",	  "--open-gateway", "--prefill", pl,  "--decode",
	    dl,		 "--secret-file", (char *)sec,	    "--port",	 "0", "--port-file",
	    (char *)pf};
	return spawn_plus(argv, NFIXED, NALL, extra, log);
}

pid_t ptu_encoder(const char *bin, const char *mmproj, const char *kv, const char *sec,
		  const char *pf, const char *mf, const char *log, const char *const *extra)
{
	enum { NFIXED = 16, NALL = NFIXED + 16 };
	char *argv[NALL + 1] = {(char *)bin,
				"encode",
				"--mmproj",
				(char *)mmproj,
				"--kv-dir",
				(char *)kv,
				"--secret-file",
				(char *)sec,
				"-t",
				"1",
				"--port-file",
				(char *)pf,
				"--metrics-listen",
				"127.0.0.1:0",
				"--metrics-addr-file",
				(char *)mf};
	return spawn_plus(argv, NFIXED, NALL, extra, log);
}

pid_t ptu_serve_vision(const char *bin, const char *model, const char *mmproj, const char *kv,
		       const char *pf, const char *log, const char *const *extra)
{
	enum { NFIXED = 19, NALL = NFIXED + 16 };
	char *argv[NALL + 1] = {
	    (char *)bin,     "serve",	 "-m",	   (char *)model, "--mmproj",	    (char *)mmproj,
	    "--kv-dir",	     (char *)kv, "-t",	   "1",		  "--block-tokens", "16",
	    "--ctx",	     "512",	 "--port", "0",		  "--port-file",    (char *)pf,
	    "--open-gateway"};
	return spawn_plus(argv, NFIXED, NALL, extra, log);
}

pid_t ptu_gateway(const char *bin, const char *dir, int i, uint16_t pport, uint16_t dport,
		  const char *sec, const char *const *extra)
{
	char pf[1024], log[1024];
	snprintf(pf, sizeof(pf), "%s/gport%d", dir, i);
	snprintf(log, sizeof(log), "%s/glog%d", dir, i);
	return ptu_gateway_at(bin, pf, log, pport, dport, sec, extra);
}

void ptu_assert_healthy(const char *dir, const pid_t *w, int nw, const pid_t *g, int ng)
{
	for (int i = 0; i < nw + ng; i++) {
		pid_t p = i < nw ? w[i] : g[i - nw];
		assert_int_equal(waitpid(p, NULL, WNOHANG), 0);
		char path[1024];
		snprintf(path, sizeof(path), "%s/%s%d", dir, i < nw ? "wlog" : "glog",
			 i < nw ? i : i - nw);
		if (!ptu_log_clean(path))
			fail_msg("%s has a sanitizer report", path);
	}
}

int ptu_finish(const char *dir, pid_t *a, int na, pid_t *b, int nb)
{
	for (int i = 0; i < na; i++)
		ptu_stop(&a[i]);
	for (int i = 0; i < nb; i++)
		ptu_stop(&b[i]);
	if (getenv("KVFS_TEST_KEEP")) {
		fprintf(stderr, "kept %s\n", dir);
		return 0;
	}
	char cmd[1100];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

double ptu_metric(uint16_t port, const char *name)
{
	char *b = NULL;
	if (htu_request(port, 0, "GET", "/metrics", NULL, &b) != 200) {
		free(b);
		return -1;
	}
	struct prom_doc d;
	if (prom_parse(b, &d))
		fail_msg("/metrics of 127.0.0.1:%u: %s", port, d.err);
	prom_free(&d);
	double v = -1;
	size_t nl = strlen(name);
	for (char *p = b; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, name, nl) && p[nl] == ' ') {
			v = strtod(p + nl + 1, NULL);
			break;
		}
	free(b);
	return v;
}

static int grep_file(const char *path, const char *const *texts, int n)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char line[1024];
	int hit = 0;
	while (!hit && fgets(line, sizeof(line), f))
		for (int i = 0; i < n && !hit; i++)
			hit = strstr(line, texts[i]) != NULL;
	fclose(f);
	return hit;
}

int ptu_log_clean(const char *path)
{
	static const char *const reports[] = {"runtime error", "Sanitizer"};
	return grep_file(path, reports, 2) == 0;
}

int ptu_log_has(const char *path, const char *text)
{
	return grep_file(path, &text, 1) == 1;
}
