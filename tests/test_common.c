/* Tests for common/: the option table (defaults, file, flags, bounds, errors). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cfg.h"

struct conf {
	char name[CFG_STR_MAX];
	int64_t port;
	int verbose;
	uint64_t cap;
	double ttl;
};

static const struct cfg_opt opts[] = {
    {"name", CFG_STR, offsetof(struct conf, name), 0, 0, "node0", "node name"},
    {"port", CFG_INT, offsetof(struct conf, port), 0, 65535, "7000", "TCP port"},
    {"verbose", CFG_BOOL, offsetof(struct conf, verbose), 0, 0, "false", "chatty"},
    {"capacity", CFG_SIZE, offsetof(struct conf, cap), 0, 0, "1G", "bytes"},
    {"ttl", CFG_SECS, offsetof(struct conf, ttl), 0, 0, "72h", "retention"},
    CFG_END,
};

static void test_defaults(void **state)
{
	(void)state;
	struct conf c;
	memset(&c, 0xAA, sizeof(c));
	assert_int_equal(cfg_defaults(opts, &c), 0);
	assert_string_equal(c.name, "node0");
	assert_int_equal(c.port, 7000);
	assert_int_equal(c.verbose, 0);
	assert_int_equal(c.cap, 1ull << 30);
	assert_true(c.ttl == 72 * 3600.0);
}

static void test_flags_and_positionals(void **state)
{
	(void)state;
	struct conf c;
	char *argv[] = {"prog",		  "pos1", "--port", "80",     "--verbose",
			"--capacity=64K", "pos2", "--ttl",  "1500ms", NULL};
	int npos = -1;
	assert_int_equal(cfg_parse(opts, &c, 9, argv, "ARGS", &npos), 0);
	assert_int_equal(npos, 2);
	assert_string_equal(argv[1], "pos1");
	assert_string_equal(argv[2], "pos2");
	assert_int_equal(c.port, 80);
	assert_int_equal(c.verbose, 1);
	assert_int_equal(c.cap, 65536);
	assert_true(c.ttl > 1.49 && c.ttl < 1.51);
}

static void test_bad_values(void **state)
{
	(void)state;
	struct conf c;
	char *a1[] = {"prog", "--port", "70000"};
	assert_int_equal(cfg_parse(opts, &c, 3, a1, "", NULL), -EINVAL);
	char *a2[] = {"prog", "--nope", "1"};
	assert_int_equal(cfg_parse(opts, &c, 3, a2, "", NULL), -EINVAL);
	char *a3[] = {"prog", "--capacity", "12Q"};
	assert_int_equal(cfg_parse(opts, &c, 3, a3, "", NULL), -EINVAL);
	char *a4[] = {"prog", "--port"};
	assert_int_equal(cfg_parse(opts, &c, 2, a4, "", NULL), -EINVAL);
	uint64_t v;
	assert_int_equal(cfg_parse_size("99999999999T", &v), -EINVAL);
	assert_int_equal(cfg_parse_size("-1", &v), -EINVAL);
	assert_int_equal(cfg_parse_size("4MiB", &v), 0);
	assert_int_equal(v, 4u << 20);
}

static void test_config_file(void **state)
{
	(void)state;
	char path[] = "/tmp/kvfs-cfg-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	const char *text = "# a comment\nname = meta1\n  port=9000  \nttl = 2d\n";
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	struct conf c;
	/* Flags win over the file whatever their order. */
	char *argv[] = {"prog", "--port", "1", "--config", path};
	assert_int_equal(cfg_parse(opts, &c, 5, argv, "", NULL), 0);
	assert_string_equal(c.name, "meta1");
	assert_int_equal(c.port, 1);
	assert_true(c.ttl == 2 * 86400.0);

	FILE *f = fopen(path, "w");
	fputs("bogus = 1\n", f);
	fclose(f);
	char *argv2[] = {"prog", "--config", path};
	assert_int_equal(cfg_parse(opts, &c, 3, argv2, "", NULL), -EINVAL);
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_defaults),
	    cmocka_unit_test(test_flags_and_positionals),
	    cmocka_unit_test(test_bad_values),
	    cmocka_unit_test(test_config_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
