/* mount_tutil — the fixture of the test_mount binary (test_mount.c, test_mount_replace.c): a
 * cluster of real kvfs-meta + 11 kvfs-node processes (tests/harness.h), the real kvfs-mount on
 * g_mnt, an optional second mount on g_mnt2, and the file helpers the tests share. */
#ifndef KVFS_MOUNT_TUTIL_H
#define KVFS_MOUNT_TUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

#define NNODES	      11
#define FUSE_MAGIC    0x65735546
#define MAX_FILE_TEST (16u << 20)

extern struct kvh_cluster g_cl;
extern char g_mnt[600], g_bin[600], g_log[700];
extern pid_t g_mount_pid;
extern char g_mnt2[700]; /* a second mount of the cluster (test_replace_other_mount) */
extern pid_t g_mount2_pid;

int64_t mtu_now_ms(void);
/* n bytes of the pseudo-random stream of seed. */
void mtu_fill(uint8_t *p, size_t n, uint64_t seed);
/* 1 when path is on a FUSE file system. */
int mtu_is_fuse(const char *path);
/* Creates or truncates path with len bytes of buf; 0 or -errno. */
int mtu_write_file(const char *path, const void *buf, size_t len);
/* Reads the whole file (at most cap bytes); returns its length or -errno. */
ssize_t mtu_read_file(const char *path, void *buf, size_t cap);
/* Starts kvfs-mount on g_mnt (log g_log) and waits for the mount; 0 or -1. */
int mtu_start_mount(void);
/* Starts a second kvfs-mount of the cluster on g_mnt2 = <cluster dir>/mnt-<tag> (created; log
 * in log2, cap bytes), with "-o opts" when opts is not NULL, and waits for it: 0 or -1. The
 * caller's environment is the daemon's (test hooks). */
int mtu_start_mount2(const char *tag, const char *opts, char *log2, size_t cap);
/* Unmounts and stops the mount on g_mnt / g_mnt2, if running. */
void mtu_stop_mount(void);
/* A counter of mnt's .kvfs/stats (e.g. "lease_granted"), or -1. */
long long mtu_stat_counter(const char *mnt, const char *name);
void mtu_stop_mount2(void);
/* 1 (after saying why) when these tests cannot run here: no /dev/fuse, or kvfs-mount not
 * built; main then exits 77 (skipped). */
int mtu_skip(void);
/* cmocka group setup/teardown: the cluster and the mount on g_mnt. */
int mtu_setup(void **state);
int mtu_teardown(void **state);

/* The replacement tests (test_mount_replace.c): no reader ever sees a new or replaced file
 * partially, and replacements as applications meet them. */
void test_no_partial(void **state);
void test_replace_race(void **state);
void test_replace_hold(void **state);
void test_replace_shell(void **state);
void test_replace_nowait(void **state);
void test_replace_two_writers(void **state);
void test_replace_other_mount(void **state);
void test_replace_append(void **state);
void test_replace_killed(void **state);
/* test_mount_lease.c */
void test_lease_other_mount(void **state);
void test_lease_stopped_holder(void **state);
void test_lease_renewed(void **state);
void test_lease_pin_cached(void **state);
void test_lease_pin_inval(void **state);
void test_lease_pin_meta_restart(void **state);

/* test_mount_perm.c: allow-other with two unprivileged users (owners and modes enforced). */
void test_allow_other_perms(void **state);

#endif
