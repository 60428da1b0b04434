/* cfg — one declarative option table drives a program's flags, config file, --help and a
 * config dump.
 *
 * A program declares `static const struct cfg_opt opts[]` ending in CFG_END, each entry naming
 * a field of the program's own config struct by offset. cfg_parse() applies, in order:
 * defaults, then `--config FILE` (lines `name = value`, `#` comments), then flags
 * (`--name value` or `--name=value`; a bool flag alone means true). Later wins.
 * Not thread-safe against concurrent use of the same struct; stateless otherwise.
 */
#ifndef KVFS_CFG_H
#define KVFS_CFG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum cfg_type {
	CFG_STR = 0,  /* char[CFG_STR_MAX] field */
	CFG_INT = 1,  /* int64_t field, bounds checked */
	CFG_BOOL = 2, /* int field: 0/1, accepts true/false/yes/no/on/off/1/0 */
	CFG_SIZE = 3, /* uint64_t field: bytes, accepts K/M/G/T suffixes (powers of 1024) */
	CFG_SECS = 4, /* double field: seconds, accepts ms/s/m/h/d suffixes */
};

#define CFG_STR_MAX 256

struct cfg_opt {
	const char *name;
	enum cfg_type type;
	size_t offset;
	double min, max; /* bounds for INT, SIZE, SECS; ignored when min == max */
	const char *def; /* default, as text; NULL = empty / zero */
	const char *help;
};

#define CFG_END                                                                                    \
	{                                                                                          \
		NULL, 0, 0, 0, 0, NULL, NULL                                                       \
	}

/* Parses argv into obj. Positional arguments are moved to the front of argv[1..] and their count
 * is returned through *npos (argv[1..*npos]). On --help prints usage to stdout and returns 1; on
 * --dump-config prints every option's value and returns 1. Returns 0 on success, -EINVAL with a
 * message on stderr naming the bad option or value. `usage` is the positional-argument synopsis. */
int cfg_parse(const struct cfg_opt *opts, void *obj, int argc, char **argv, const char *usage,
	      int *npos);

/* Sets defaults only (for library users that build the struct themselves). */
int cfg_defaults(const struct cfg_opt *opts, void *obj);

/* Sets one option from text; -ENOENT if the name is unknown, -EINVAL if the value is bad. */
int cfg_set(const struct cfg_opt *opts, void *obj, const char *name, const char *value);

/* Writes `name = value` for every option. */
void cfg_dump(const struct cfg_opt *opts, const void *obj, FILE *out);

/* Parses a size ("64K", "1M", "10G") into bytes; -EINVAL on garbage or overflow. */
int cfg_parse_size(const char *s, uint64_t *out);

#endif
