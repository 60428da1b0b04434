/* lb-sim: runs the gateway's balancer policies over a simulated cluster (lbsim.h) and reports
 * balance, cache hits, TTFT and decode rate per policy beside the oracle bounds. Usage: --help;
 * docs/balancing.md shows runs. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "lbsim.h"

static void usage(void)
{
	fprintf(
	    stderr,
	    "usage: lb-sim [options]\n"
	    "  --prefill N --decode N     replicas per stage (default 64 + 64; max %d)\n"
	    "  --policy P                 rr, least, cache, prefix, chash, oracle or all (default "
	    "all)\n"
	    "  --requests N               generated requests (default 20000)\n"
	    "  --seed N                   generator seed (default 1)\n"
	    "  --load F                   offered prefill load, share of capacity (default 0.8)\n"
	    "  --rate R                   arrivals per second (overrides --load)\n"
	    "  --trace FILE               replay a trace file instead of generating\n"
	    "  --write-trace FILE         write the trace used\n"
	    "  --out DIR                  per-window loads per policy, report, gnuplot plot\n"
	    "  --decisions FILE           'request prefill decode' per request (one policy)\n"
	    "  --pf-addrs A,B,...         prefill replica addresses (rendezvous identities)\n"
	    "  --local-blocks N           each prefill replica's local cache (default 16384)\n"
	    "  --pf-tps N --kvfs-tps N    prefill compute and kvfs load rates, tokens/s\n"
	    "  --kv-blocks N --max-batch N --step-ms BASE,PER_SEQ   decode replica\n"
	    "  --pf-overhead-ms N --handoff-ms N --status-ms N --window-s N\n",
	    LBSIM_MAX);
}

static int split_addrs(char *s, const char **out, int max)
{
	int n = 0;
	for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ","))
		if (n < max)
			out[n++] = tok;
		else
			return -E2BIG;
	return n;
}

/* Mean prefill seconds per request on one replica when every block seen before is in kvfs
 * (computing the rest, loading those, the fixed overhead): the offered load's unit. */
static double mean_work(const struct lbsim_trace *t, const struct lbsim_cfg *run)
{
	struct lbsim_cfg c;
	lbsim_cfg_defaults(&c);
	c.prefill = c.decode = 1;
	c.oracle = 1;
	c.pf_tps = 1e12; /* instant: only the hit count matters here */
	c.kvfs_tps = 1e12;
	c.max_batch = 1 << 20;
	c.kv_blocks = 1 << 30;
	c.step_base_ms = 0;
	c.step_seq_ms = 0;
	struct lbsim_report r;
	double tok = 0;
	for (size_t i = 0; i < t->n; i++)
		tok += t->r[i].ptok;
	double hit = lbsim_run(&c, t, &r) ? 0 : r.hit_oracle;
	return (tok * (1 - hit) / run->pf_tps + tok * hit / run->kvfs_tps) / (double)t->n +
	       run->pf_overhead_ms / 1000.0;
}

static const char *const run_names[] = {"rr", "least", "cache", "prefix", "chash", "oracle"};
#define NRUNS 6

int main(int argc, char **argv)
{
	struct lbsim_cfg c;
	struct lbsim_gen g;
	lbsim_cfg_defaults(&c);
	lbsim_gen_defaults(&g);
	const char *policy = "all", *trace = NULL, *wtrace = NULL, *outdir = NULL, *dec = NULL;
	char *addrs = NULL;
	double load = 0.8;
	static const struct option opts[] = {
	    {"prefill", 1, 0, 'p'},	 {"decode", 1, 0, 'd'},		{"policy", 1, 0, 'P'},
	    {"requests", 1, 0, 'n'},	 {"seed", 1, 0, 's'},		{"load", 1, 0, 'l'},
	    {"rate", 1, 0, 'r'},	 {"trace", 1, 0, 't'},		{"write-trace", 1, 0, 'w'},
	    {"out", 1, 0, 'o'},		 {"decisions", 1, 0, 'D'},	{"pf-addrs", 1, 0, 'A'},
	    {"local-blocks", 1, 0, 'L'}, {"pf-tps", 1, 0, 'T'},		{"kvfs-tps", 1, 0, 'K'},
	    {"kv-blocks", 1, 0, 'B'},	 {"max-batch", 1, 0, 'M'},	{"step-ms", 1, 0, 'S'},
	    {"status-ms", 1, 0, 'H'},	 {"window-s", 1, 0, 'W'},	{"help", 0, 0, 'h'},
	    {"handoff-ms", 1, 0, 'O'},	 {"pf-overhead-ms", 1, 0, 'V'}, {0, 0, 0, 0}};
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'p':
			c.prefill = atoi(optarg);
			break;
		case 'd':
			c.decode = atoi(optarg);
			break;
		case 'P':
			policy = optarg;
			break;
		case 'n':
			g.requests = strtoull(optarg, NULL, 10);
			break;
		case 's':
			g.seed = strtoull(optarg, NULL, 10);
			break;
		case 'l':
			load = atof(optarg);
			break;
		case 'r':
			g.rate = atof(optarg);
			break;
		case 't':
			trace = optarg;
			break;
		case 'w':
			wtrace = optarg;
			break;
		case 'o':
			outdir = optarg;
			break;
		case 'D':
			dec = optarg;
			break;
		case 'A':
			addrs = optarg;
			break;
		case 'L':
			c.local_blocks = atoi(optarg);
			break;
		case 'T':
			c.pf_tps = atof(optarg);
			break;
		case 'K':
			c.kvfs_tps = atof(optarg);
			break;
		case 'B':
			c.kv_blocks = atoi(optarg);
			break;
		case 'M':
			c.max_batch = atoi(optarg);
			break;
		case 'S':
			if (sscanf(optarg, "%lf,%lf", &c.step_base_ms, &c.step_seq_ms) != 2) {
				usage();
				return 2;
			}
			break;
		case 'H':
			c.status_ms = atof(optarg);
			break;
		case 'W':
			c.window_s = atof(optarg);
			break;
		case 'O':
			c.handoff_ms = atof(optarg);
			break;
		case 'V':
			c.pf_overhead_ms = atof(optarg);
			break;
		default:
			usage();
			return o == 'h' ? 0 : 2;
		}
	}
	if (optind != argc || c.prefill < 1 || c.decode < 1 || c.prefill > LBSIM_MAX ||
	    c.decode > LBSIM_MAX || load <= 0) {
		usage();
		return 2;
	}
	const char *addr_v[LBSIM_MAX];
	if (addrs) {
		int n = split_addrs(addrs, addr_v, LBSIM_MAX);
		if (n != c.prefill) {
			fprintf(stderr, "lb-sim: --pf-addrs names %d replicas, --prefill is %d\n",
				n, c.prefill);
			return 2;
		}
		c.pf_addr = addr_v;
	}
	int first = 0, last = NRUNS - 1;
	if (strcmp(policy, "all")) {
		for (first = 0; first < NRUNS && strcmp(run_names[first], policy); first++)
			;
		if (first == NRUNS) {
			fprintf(stderr, "lb-sim: unknown policy '%s'\n", policy);
			return 2;
		}
		last = first;
	}
	if (dec && first != last) {
		fprintf(stderr, "lb-sim: --decisions needs one --policy\n");
		return 2;
	}

	struct lbsim_trace t;
	int rc;
	if (trace) {
		FILE *f = fopen(trace, "r");
		if (!f) {
			perror(trace);
			return 1;
		}
		rc = lbsim_trace_read(f, &t);
		fclose(f);
		if (!rc && !t.n)
			rc = -ENODATA;
	} else {
		int derive = g.rate <= 0;
		if (derive) /* a first trace at 1/s gives the work per request */
			g.rate = 1;
		rc = lbsim_generate(&g, &t);
		if (!rc && derive) {
			double work = mean_work(&t, &c);
			lbsim_trace_free(&t);
			g.rate = load * c.prefill / work;
			rc = lbsim_generate(&g, &t);
		}
	}
	if (rc) {
		fprintf(stderr, "lb-sim: trace: %s\n", strerror(-rc));
		return 1;
	}
	if (wtrace) {
		FILE *f = fopen(wtrace, "w");
		if (!f || lbsim_trace_write(f, &t) || fclose(f)) {
			perror(wtrace);
			return 1;
		}
	}
	if (outdir)
		mkdir(outdir, 0755);
	FILE *rep = NULL;
	if (outdir) {
		char p[4096];
		snprintf(p, sizeof(p), "%s/report.txt", outdir);
		rep = fopen(p, "w");
	}
	double span = t.r[t.n - 1].t - t.r[0].t;
	char head[512];
	snprintf(
	    head, sizeof(head),
	    "lb-sim: %zu requests over %.0f s (%.1f/s), %d prefill + %d decode replicas\n"
	    "| policy | prefill balance | decode balance | input hit local | input hit "
	    "(kvfs) | oracle hit | TTFT p50 ms | TTFT p99 ms | decode tok/s | ITL ms | sim s |\n"
	    "|---|---|---|---|---|---|---|---|---|---|---|\n",
	    t.n, span, span > 0 ? (double)t.n / span : 0, c.prefill, c.decode);
	fputs(head, stdout);
	if (rep)
		fputs(head, rep);
	for (int i = first; i <= last && !rc; i++) {
		struct lbsim_cfg ci = c;
		ci.oracle = !strcmp(run_names[i], "oracle");
		if (!ci.oracle)
			ci.pf_policy = ci.dc_policy = (enum lb_policy)lb_policy_parse(run_names[i]);
		char p[4096];
		if (outdir) {
			snprintf(p, sizeof(p), "%s/%s.series", outdir, run_names[i]);
			ci.series = fopen(p, "w");
		}
		if (dec)
			ci.decisions = fopen(dec, "w");
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		struct lbsim_report r;
		rc = lbsim_run(&ci, &t, &r);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (ci.series)
			fclose(ci.series);
		if (ci.decisions)
			fclose(ci.decisions);
		if (rc) {
			fprintf(stderr, "lb-sim: %s: %s\n", run_names[i], strerror(-rc));
			break;
		}
		char line[512];
		snprintf(
		    line, sizeof(line),
		    "| %s | %.3f | %.3f | %.1f%% | %.1f%% | %.1f%% | %.0f | %.0f | %.0f | %.1f | "
		    "%.1f |\n",
		    run_names[i], r.pf_balance, r.dc_balance, 100 * r.hit_local, 100 * r.hit_total,
		    100 * r.hit_oracle, 1000 * r.ttft_p50, 1000 * r.ttft_p99, r.decode_tps,
		    r.itl_mean_ms,
		    (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
		fputs(line, stdout);
		fflush(stdout);
		if (rep)
			fputs(line, rep);
	}
	if (rep)
		fclose(rep);
	if (outdir && !rc) {
		char p[4096];
		snprintf(p, sizeof(p), "%s/plot.gp", outdir);
		FILE *f = fopen(p, "w");
		if (f) {
			fprintf(
			    f,
			    "# gnuplot %s/plot.gp: prefill busy share and decode batch per window\n"
			    "set terminal pngcairo size 1200,800\nset output '%s/loads.png'\n"
			    "set multiplot layout 2,1\nset key outside right\n"
			    "set ylabel 'prefill busy (min/mean/max)'\n",
			    outdir, outdir);
			for (int pass = 0; pass < 2; pass++) {
				if (pass) {
					fprintf(f, "set xlabel 'simulated s'\n"
						   "set ylabel 'decode batch (min/mean/max)'\n");
				}
				fprintf(f, "plot ");
				for (int i = first; i <= last; i++) {
					int col = pass ? 5 : 2;
					fprintf(
					    f,
					    "%s'%s/%s.series' u 1:%d:%d w filledcurves lc %d fs "
					    "transparent solid 0.12 notitle, '' u 1:%d w l lc %d "
					    "lw 2 t '%s'",
					    i > first ? ", " : "", outdir, run_names[i], col,
					    col + 2, i + 1, col + 1, i + 1, run_names[i]);
				}
				fprintf(f, "\n");
			}
			fprintf(f, "unset multiplot\n");
			fclose(f);
		}
	}
	lbsim_trace_free(&t);
	return rc ? 1 : 0;
}
