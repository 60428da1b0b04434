#include "cfg.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct cfg_opt *find(const struct cfg_opt *opts, const char *name, size_t len)
{
	for (const struct cfg_opt *o = opts; o->name; o++)
		if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
			return o;
	return NULL;
}

int cfg_parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return -EINVAL;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	unsigned shift = 0;
	switch (*end) {
	case 0:
		break;
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	case 't':
	case 'T':
		shift = 40;
		end++;
		break;
	default:
		return -EINVAL;
	}
	if (*end == 'i' || *end == 'B')
		end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
	if (*end)
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_secs(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !isfinite(v))
		return -EINVAL;
	double mul = 1;
	if (strcmp(end, "ms") == 0)
		mul = 0.001;
	else if (strcmp(end, "s") == 0 || *end == 0)
		mul = 1;
	else if (strcmp(end, "m") == 0)
		mul = 60;
	else if (strcmp(end, "h") == 0)
		mul = 3600;
	else if (strcmp(end, "d") == 0)
		mul = 86400;
	else
		return -EINVAL;
	*out = v * mul;
	return 0;
}

static int parse_bool(const char *s, int *out)
{
	static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
	for (int i = 0; i < 4; i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = 0;
			return 0;
		}
	}
	return -EINVAL;
}

static int in_bounds(const struct cfg_opt *o, double v)
{
	return o->min == o->max || (v >= o->min && v <= o->max);
}

static int apply(const struct cfg_opt *o, void *obj, const char *value)
{
	char *field = (char *)obj + o->offset;
	if (!value)
		value = "";
	switch (o->type) {
	case CFG_STR:
		if (strlen(value) >= CFG_STR_MAX)
			return -EINVAL;
		strcpy(field, value);
		return 0;
	case CFG_INT: {
		char *end;
		errno = 0;
		long long v = *value ? strtoll(value, &end, 0) : 0;
		if (*value && (errno || *end))
			return -EINVAL;
		if (!in_bounds(o, (double)v))
			return -ERANGE;
		*(int64_t *)field = v;
		return 0;
	}
	case CFG_BOOL: {
		int b = 0;
		if (*value && parse_bool(value, &b))
			return -EINVAL;
		*(int *)field = b;
		return 0;
	}
	case CFG_SIZE: {
		uint64_t v = 0;
		if (*value && cfg_parse_size(value, &v))
			return -EINVAL;
		if (!in_bounds(o, (double)v))
			return -ERANGE;
		*(uint64_t *)field = v;
		return 0;
	}
	case CFG_SECS: {
		double v = 0;
		if (*value && parse_secs(value, &v))
			return -EINVAL;
		if (!in_bounds(o, v))
			return -ERANGE;
		*(double *)field = v;
		return 0;
	}
	}
	return -EINVAL;
}

int cfg_set(const struct cfg_opt *opts, void *obj, const char *name, const char *value)
{
	const struct cfg_opt *o = find(opts, name, strlen(name));
	if (!o)
		return -ENOENT;
	return apply(o, obj, value) ? -EINVAL : 0;
}

int cfg_defaults(const struct cfg_opt *opts, void *obj)
{
	for (const struct cfg_opt *o = opts; o->name; o++) {
		int rc = apply(o, obj, o->def);
		if (rc) {
			fprintf(stderr, "config: bad default for %s\n", o->name);
			return -EINVAL;
		}
	}
	return 0;
}

static void bad(const struct cfg_opt *o, const char *value, const char *where)
{
	static const char *kinds[] = {"a string", "an integer", "a boolean", "a size",
				      "a duration"};
	fprintf(stderr, "%s: bad value '%s' for %s: expected %s", where, value, o->name,
		kinds[o->type]);
	if (o->min != o->max)
		fprintf(stderr, " in [%g, %g]", o->min, o->max);
	fputc('\n', stderr);
}

static int load_file(const struct cfg_opt *opts, void *obj, const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "config: cannot open %s: %s\n", path, strerror(errno));
		return -EINVAL;
	}
	char line[1024];
	int lineno = 0, rc = 0;
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		char *p = line, *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		while (*p == ' ' || *p == '\t')
			p++;
		size_t n = strlen(p);
		while (n && (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' ' ||
			     p[n - 1] == '\t'))
			p[--n] = 0;
		if (!*p)
			continue;
		char *eq = strchr(p, '=');
		if (!eq) {
			fprintf(stderr, "%s:%d: expected 'name = value'\n", path, lineno);
			rc = -EINVAL;
			break;
		}
		char *ke = eq;
		while (ke > p && (ke[-1] == ' ' || ke[-1] == '\t'))
			ke--;
		char *v = eq + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		const struct cfg_opt *o = find(opts, p, (size_t)(ke - p));
		if (!o) {
			fprintf(stderr, "%s:%d: unknown option '%.*s'\n", path, lineno,
				(int)(ke - p), p);
			rc = -EINVAL;
			break;
		}
		if (apply(o, obj, v)) {
			bad(o, v, path);
			rc = -EINVAL;
			break;
		}
	}
	fclose(f);
	return rc;
}

static void usage_print(const struct cfg_opt *opts, const char *prog, const char *usage)
{
	printf("usage: %s [options] %s\n\noptions:\n", prog, usage ? usage : "");
	printf("  --config FILE          read options from FILE (name = value lines)\n");
	printf("  --help                 this text\n");
	printf("  --dump-config          print every option's value and exit\n");
	for (const struct cfg_opt *o = opts; o->name; o++) {
		char left[64];
		snprintf(left, sizeof(left), "--%s%s", o->name, o->type == CFG_BOOL ? "" : " V");
		printf("  %-22s %s", left, o->help ? o->help : "");
		if (o->def && *o->def)
			printf(" (default %s)", o->def);
		putchar('\n');
	}
}

void cfg_dump(const struct cfg_opt *opts, const void *obj, FILE *out)
{
	for (const struct cfg_opt *o = opts; o->name; o++) {
		const char *field = (const char *)obj + o->offset;
		switch (o->type) {
		case CFG_STR:
			fprintf(out, "%s = %s\n", o->name, field);
			break;
		case CFG_INT:
			fprintf(out, "%s = %" PRId64 "\n", o->name, *(const int64_t *)field);
			break;
		case CFG_BOOL:
			fprintf(out, "%s = %s\n", o->name, *(const int *)field ? "true" : "false");
			break;
		case CFG_SIZE:
			fprintf(out, "%s = %" PRIu64 "\n", o->name, *(const uint64_t *)field);
			break;
		case CFG_SECS:
			fprintf(out, "%s = %gs\n", o->name, *(const double *)field);
			break;
		}
	}
}

int cfg_parse(const struct cfg_opt *opts, void *obj, int argc, char **argv, const char *usage,
	      int *npos)
{
	int rc = cfg_defaults(opts, obj), dump = 0;
	if (rc)
		return rc;
	const char *prog = argc > 0 ? argv[0] : "kvfs";
	/* The config file is applied before any flag, wherever --config appears. */
	for (int i = 1; i < argc; i++) {
		const char *path = NULL;
		if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			path = argv[i + 1];
		else if (strncmp(argv[i], "--config=", 9) == 0)
			path = argv[i] + 9;
		if (path && (rc = load_file(opts, obj, path)))
			return rc;
	}
	int pos = 0;
	for (int i = 1; i < argc; i++) {
		char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			for (i++; i < argc; i++)
				argv[1 + pos++] = argv[i];
			break;
		}
		if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
			argv[1 + pos++] = a;
			continue;
		}
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t len = eq ? (size_t)(eq - name) : strlen(name);
		if (len == 4 && strncmp(name, "help", 4) == 0) {
			usage_print(opts, prog, usage);
			return 1;
		}
		if (len == 11 && strncmp(name, "dump-config", 11) == 0) {
			dump = 1;
			continue;
		}
		if (len == 6 && strncmp(name, "config", 6) == 0) {
			if (!eq)
				i++;
			continue;
		}
		const struct cfg_opt *o = find(opts, name, len);
		if (!o) {
			fprintf(stderr, "%s: unknown option --%.*s (see --help)\n", prog, (int)len,
				name);
			return -EINVAL;
		}
		const char *value = eq ? eq + 1 : NULL;
		if (!value && o->type == CFG_BOOL)
			value = "true";
		if (!value) {
			if (i + 1 >= argc) {
				fprintf(stderr, "%s: option --%s needs a value\n", prog, o->name);
				return -EINVAL;
			}
			value = argv[++i];
		}
		if (apply(o, obj, value)) {
			bad(o, value, prog);
			return -EINVAL;
		}
	}
	if (npos)
		*npos = pos;
	if (dump) {
		cfg_dump(opts, obj, stdout);
		return 1;
	}
	return 0;
}
