/* A minimal stand-in for cmocka, used ONLY by tools/gpu-check.sh when it has to build the GPU
 * tests on a machine without libcmocka (the GPU machine has no package registry). It covers
 * the subset the kernel tests use, with cmocka's meaning: a failed assertion fails the current
 * test and moves on to the next; the run returns the number of failed tests. Normal builds use
 * the real cmocka (CMake requires it). */
#ifndef KVFS_CMOCKA_SHIM_H
#define KVFS_CMOCKA_SHIM_H

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*CMUnitTestFunction)(void **state);
typedef int (*CMFixtureFunction)(void **state);
struct CMUnitTest {
	const char *name;
	CMUnitTestFunction test_func;
};

#define cmocka_unit_test(f)                                                                        \
	{                                                                                          \
#f, f                                                                              \
	}

static jmp_buf cmshim_jmp;

static void cmshim_fail(const char *file, int line, const char *what)
{
	printf("[  ERROR   ] --- %s\n[   LINE   ] --- %s:%d: error: Failure!\n", what, file, line);
	longjmp(cmshim_jmp, 1);
}

#define cmshim_check(cond, ...)                                                                    \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			char m_[512];                                                              \
			snprintf(m_, sizeof(m_), __VA_ARGS__);                                     \
			cmshim_fail(__FILE__, __LINE__, m_);                                       \
		}                                                                                  \
	} while (0)

#define assert_true(c)	   cmshim_check((c), "%s is not true", #c)
#define assert_false(c)	   cmshim_check(!(c), "%s is not false", #c)
#define assert_non_null(p) cmshim_check((p) != NULL, "%s is NULL", #p)
#define assert_null(p)	   cmshim_check((p) == NULL, "%s is not NULL", #p)
#define assert_int_equal(a, b)                                                                     \
	do {                                                                                       \
		intmax_t a_ = (intmax_t)(a), b_ = (intmax_t)(b);                                   \
		cmshim_check(a_ == b_, "%jd != %jd", a_, b_);                                      \
	} while (0)
#define assert_int_not_equal(a, b)                                                                 \
	do {                                                                                       \
		intmax_t a_ = (intmax_t)(a), b_ = (intmax_t)(b);                                   \
		cmshim_check(a_ != b_, "%jd == %jd", a_, b_);                                      \
	} while (0)
#define assert_float_equal(a, b, eps)                                                              \
	do {                                                                                       \
		double a_ = (double)(a), b_ = (double)(b);                                         \
		cmshim_check(fabs(a_ - b_) <= (double)(eps), "%f != %f", a_, b_);                  \
	} while (0)
#define assert_memory_equal(a, b, n)                                                               \
	cmshim_check(memcmp((a), (b), (n)) == 0, "%s and %s differ", #a, #b)
#define fail_msg(...)                                                                              \
	do {                                                                                       \
		char m_[512];                                                                      \
		snprintf(m_, sizeof(m_), __VA_ARGS__);                                             \
		cmshim_fail(__FILE__, __LINE__, m_);                                               \
	} while (0)
#define fail() fail_msg("fail()")
#define assert_in_range(v, lo, hi)                                                                 \
	do {                                                                                       \
		intmax_t v_ = (intmax_t)(v), l_ = (intmax_t)(lo), h_ = (intmax_t)(hi);             \
		cmshim_check(v_ >= l_ && v_ <= h_, "%jd is not within [%jd, %jd]", v_, l_, h_);    \
	} while (0)
#define assert_ptr_equal(a, b)                                                                     \
	cmshim_check((const void *)(a) == (const void *)(b), "%p != %p", (const void *)(a),        \
		     (const void *)(b))
#define assert_ptr_not_equal(a, b)                                                                 \
	cmshim_check((const void *)(a) != (const void *)(b), "%p == %p", (const void *)(a),        \
		     (const void *)(b))
#define assert_string_equal(a, b)   cmshim_check(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))
#define assert_return_code(rc, err) cmshim_check((rc) >= 0, "%s < 0 (errno %d)", #rc, (int)(err))
#define assert_memory_not_equal(a, b, n)                                                           \
	cmshim_check(memcmp((a), (b), (n)) != 0, "%s and %s are equal", #a, #b)
#define print_message(...) printf(__VA_ARGS__)

static int cmshim_run(const char *group, const struct CMUnitTest *t, size_t n,
		      CMFixtureFunction setup, CMFixtureFunction teardown)
{
	void *state = NULL;
	volatile int failed = 0;
	printf("[==========] %s: Running %zu test(s).\n", group, n);
	if (setup && setup(&state)) {
		printf("[  ERROR   ] %s: group setup failed\n", group);
		return (int)n;
	}
	for (size_t i = 0; i < n; i++) {
		printf("[ RUN      ] %s\n", t[i].name);
		fflush(stdout);
		if (setjmp(cmshim_jmp) == 0) {
			t[i].test_func(&state);
			printf("[       OK ] %s\n", t[i].name);
		} else {
			printf("[  FAILED  ] %s\n", t[i].name);
			failed++;
		}
		fflush(stdout);
	}
	if (teardown)
		teardown(&state);
	printf("[==========] %s: %zu test(s) run.\n[  PASSED  ] %zu test(s).\n", group, n,
	       n - (size_t)failed);
	if (failed)
		printf("[  FAILED  ] %d test(s)\n", failed);
	return failed;
}

#define cmocka_run_group_tests_name(name, tests, setup, teardown)                                  \
	cmshim_run((name), (tests), sizeof(tests) / sizeof((tests)[0]), (setup), (teardown))

#endif
