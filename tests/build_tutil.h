/* Where a test finds the programs the build made (kvfs-meta, kvinfer-synth, ...), and what it
 * does when it cannot. cmocka's skip() exits 0: a test run by hand that skipped for want of
 * the build would read as a pass. So a missing build fails the test, saying how to point it at
 * the build, unless KVFS_TEST_ALLOW_SKIP=1 asks for skips (CTest sets KVFS_BUILD_DIR,
 * tests/CMakeLists.txt). Include after <cmocka.h>. */
#ifndef KVFS_BUILD_TUTIL_H
#define KVFS_BUILD_TUTIL_H

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* $KVFS_BUILD_DIR, else "." when the current directory holds bin/ (a run by hand from the
 * build directory), else NULL. */
static inline const char *tu_build_dir(void)
{
	const char *b = getenv("KVFS_BUILD_DIR");
	if (b && *b)
		return b;
	struct stat st;
	return stat("bin", &st) == 0 && S_ISDIR(st.st_mode) ? "." : NULL;
}

/* 1 when KVFS_TEST_ALLOW_SKIP=1: a test that lacks the build may skip. */
static inline int tu_skip_allowed(void)
{
	const char *s = getenv("KVFS_TEST_ALLOW_SKIP");
	return s && !strcmp(s, "1");
}

/* Ends the running cmocka test, which lacks what (a program of the build, or the build
 * directory): a failure, or a skip under KVFS_TEST_ALLOW_SKIP=1. Does not return. */
static inline void tu_no_build(const char *what)
{
	const char *b = getenv("KVFS_BUILD_DIR");
	if (tu_skip_allowed()) {
		print_message("%s not found: skipped (KVFS_TEST_ALLOW_SKIP=1)\n", what);
		skip();
	}
	fail_msg("%s not found (KVFS_BUILD_DIR %s%s): set KVFS_BUILD_DIR to the build directory "
		 "(ctest does), or KVFS_TEST_ALLOW_SKIP=1 to skip",
		 what, b ? "= " : "unset", b ? b : "");
}

/* The build directory (tu_build_dir), or the running test ends through tu_no_build. */
static inline const char *tu_need_build_dir(void)
{
	const char *b = tu_build_dir();
	if (!b)
		tu_no_build("the build directory");
	return b ? b : ".";
}

#endif
