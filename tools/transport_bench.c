/* kvfs-transport-bench — what the transport itself costs per byte: one process, one kvp_server
 * and one kvp_client on loopback, N calls each sending 1 MiB and answered with 1 MiB, with the
 * default TLS transport and with the insecure plaintext one, ROUNDS rounds alternating.
 * Prints the process's CPU time (user + system, both ends) and wall time per mode; the CPU
 * figure holds even on a loaded machine, the wall one does not. SIZE: bytes each way instead of
 * 1 MiB; "put": the answer is empty, as a chunk PUT's (208 KiB up: a 2 MiB file's chunk);
 * "get": the request is 16 bytes, as a chunk GET's.
 *
 *   build/tools/kvfs-transport-bench [CALLS=1000] [ROUNDS=3] [SIZE=1M bytes] [put|get] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvp_frame.h"

#define MIB (1u << 20)

static uint32_t g_size = MIB, g_up = MIB, g_down = MIB; /* bytes up and down per call */

static int echo(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	kvp_reply(c, h, 0, NULL, 0, ctx, g_down);
	free(body);
	return 0;
}

static double now(clockid_t id)
{
	struct timespec t;
	clock_gettime(id, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* One mode's run; 0 or a negative errno. */
static int run(int plain, int calls, uint8_t *blob, double *cpu, double *wall)
{
	struct kvp_secret s;
	if (kvp_secret_from_string("transport-bench-secret-0123", &s))
		return -1;
	s.insecure_plaintext = plain;
	struct kvp_server_opts o = {
	    .name = "bench", .host = "127.0.0.1", .secret = &s, .handler = echo, .ctx = blob};
	struct kvp_server *sv;
	int rc = kvp_server_start(&o, &sv);
	if (rc)
		return rc;
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", kvp_server_port(sv));
	struct kvp_client *c;
	if ((rc = kvp_client_open(addr, &s, 2000, &c))) {
		kvp_server_stop(sv);
		return rc;
	}
	double c0 = now(CLOCK_PROCESS_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
	for (int i = 0; i < calls && !rc; i++) {
		uint8_t *b = NULL;
		uint32_t len = 0;
		rc = kvp_call(c, 0x10, NULL, 0, blob, g_up, 10000, &b, &len);
		if (!rc && len != g_down)
			rc = -1;
		free(b);
	}
	*cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
	*wall = now(CLOCK_MONOTONIC) - w0;
	kvp_client_close(c);
	kvp_server_stop(sv);
	return rc;
}

int main(int argc, char **argv)
{
	int calls = argc > 1 ? atoi(argv[1]) : 1000, rounds = argc > 2 ? atoi(argv[2]) : 3;
	long size = argc > 3 ? atol(argv[3]) : MIB;
	if (calls < 1 || rounds < 1 || size < 1 || size > 8 * MIB) {
		fprintf(stderr, "usage: kvfs-transport-bench [CALLS] [ROUNDS] [SIZE] [put|get]\n");
		return 2;
	}
	g_size = (uint32_t)size;
	const char *shape = argc > 4 ? argv[4] : "";
	g_down = !strcmp(shape, "put") ? 0 : g_size;
	g_up = !strcmp(shape, "get") ? 16 : g_size;
	uint8_t *blob = malloc(g_size);
	if (!blob)
		return 1;
	for (unsigned i = 0; i < g_size; i++)
		blob[i] = (uint8_t)(i * 131);
	double best_cpu[2] = {1e9, 1e9}, best_wall[2] = {1e9, 1e9};
	for (int r = 0; r < rounds; r++) {
		for (int k = 0; k < 2; k++) {
			int plain = (r + k) % 2;
			double cpu, wall;
			int rc = run(plain, calls, blob, &cpu, &wall);
			if (rc) {
				fprintf(stderr, "kvfs-transport-bench: %s run failed: %d\n",
					plain ? "plaintext" : "TLS", rc);
				return 1;
			}
			printf("round %d %-9s cpu %.2f s  wall %.2f s\n", r + 1,
			       plain ? "plaintext" : "TLS", cpu, wall);
			if (cpu < best_cpu[plain])
				best_cpu[plain] = cpu;
			if (wall < best_wall[plain])
				best_wall[plain] = wall;
		}
	}
	double bytes = (double)calls * (g_up + g_down);
	printf("%d calls x (%u B up + %u B down), best of %d rounds:\n", calls, g_up, g_down,
	       rounds);
	for (int plain = 0; plain < 2; plain++)
		printf("%-9s cpu %.2f s (%.2f ns/byte both ends)  wall %.2f s (%.0f MiB/s)\n",
		       plain ? "plaintext" : "TLS", best_cpu[plain], best_cpu[plain] / bytes * 1e9,
		       best_wall[plain], bytes / MIB / best_wall[plain]);
	printf("TLS costs %.2f ns/byte more CPU (encrypt + decrypt + their copies)\n",
	       (best_cpu[0] - best_cpu[1]) / bytes * 1e9);
	free(blob);
	return 0;
}
