/* link_delay — a userspace link delayer for cross-host tests on kernels without sch_netem:
 * two TAP devices and one thread that reads each Ethernet frame the kernel sends out of one
 * and writes it into the other after a fixed delay (and, optionally, at a rate), both ways.
 * Real packets of unmodified daemons cross it: netns_tutil puts it between a host's veth and
 * the switch (see kvn_shape).
 *
 * Per direction: FIFO (frames keep their order), every frame leaves at
 *   max(arrival, the previous frame's end on the wire) + len * 8 / rate + delay,
 * the queue bounded (LKD_QUEUE frames, and at most 2 s of frames waiting for the wire, as
 * tbf's `latency 2s`): a frame beyond the bound is dropped, as a full qdisc drops it.
 *
 * Threading: one thread per delayer; lkd_start and lkd_stop from one thread (the test's). */
#ifndef KVFS_TEST_LINK_DELAY_H
#define KVFS_TEST_LINK_DELAY_H

#include <stdint.h>

#define LKD_QUEUE 8192 /* frames per direction (~16 MiB of slots each) */

struct lkd;

/* Creates TAP device name (IFF_TAP, no packet info) in the calling thread's network namespace
 * and returns its fd in *fd (non-blocking, close-on-exec; the device goes with the fd).
 * 0 or -errno (-ENOENT: no /dev/net/tun). */
int lkd_tap_open(const char *name, int *fd);

/* Starts the delayer between TAP fds a and b: delay_ms each way, rate_bps bits per second
 * each way (0: unlimited). Takes ownership of both fds (closed by lkd_stop, or here on
 * failure). 0 with *out set, or -errno. */
int lkd_start(int a, int b, double delay_ms, double rate_bps, struct lkd **out);

/* Frames passed and dropped so far, both directions (any thread; a snapshot). */
void lkd_counts(const struct lkd *d, uint64_t *passed, uint64_t *dropped);

/* Stops the thread (frames still queued are dropped), closes both fds, frees d. NULL: no-op. */
void lkd_stop(struct lkd *d);

#endif
