// The emulated NCCL (nccl.h), between threads and between processes of one machine.
//
// Bootstrap as in NCCL: ncclGetUniqueId opens a listening socket (abstract Unix namespace: no
// file, no network address) and a root thread in the calling process; the id names it. Each
// rank's ncclCommInitRank sends the root its rank, device and the name of its own data socket;
// once all joined, the root answers everyone with the table (or refuses all: two ranks on one
// device, as NCCL does) and exits. Then every rank connects to every other rank's data socket
// for the direction in which it sends: a connection carries one direction's transfers and
// their acknowledgements.
//
// Transfers run on the streams' workers: a send writes {magic, bytes} and the bytes, then
// waits for the receiver's acknowledgement; the receive checks the size (a mismatch is
// reported by both sides and becomes both devices' sticky error). A peer that goes away makes
// the operation wait until this communicator is aborted, as an NCCL kernel waits for a peer
// that never posts; ncclCommAbort shuts the sockets down, which ends its operations without
// data and without an error (the caller learns of the abort from its own bookkeeping).
//
// Devices: a device is (process, device number): each process has its own emulated GPUs.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "nccl.h"

namespace
{

constexpr uint32_t MAGIC_JOIN = 0x6b6e4a31, MAGIC_TABLE = 0x6b6e5431, MAGIC_HELLO = 0x6b6e4831,
		   MAGIC_DATA = 0x6b6e4431;
constexpr int INIT_TIMEOUT_MS = 120 * 1000;
constexpr int MAX_RANKS = 64;
constexpr char ID_PREFIX[] = "kvk-emu-nccl ";

struct join_msg {
	uint32_t magic;
	int32_t nranks, rank, device, pid;
	char data[64]; // the rank's data socket name
};
struct peer_info {
	int32_t device, pid;
	char data[64];
};
struct table_hdr {
	uint32_t magic;
	int32_t status; // ncclResult_t
};
struct hello_msg {
	uint32_t magic;
	int32_t rank;
};
struct data_hdr {
	uint32_t magic;
	uint32_t pad;
	uint64_t bytes;
};

std::atomic<unsigned long> g_names{0};

void unique_name(char *out, size_t n, const char *kind)
{
	unsigned long r = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (read(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
			r = 0;
		close(fd);
	}
	snprintf(out, n, "kvk-emu-nccl/%s/%ld/%lu/%lx", kind, (long)getpid(), g_names.fetch_add(1),
		 r ^ (unsigned long)time(NULL));
}

socklen_t addr_of(const char *name, sockaddr_un *a)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	size_t n = strnlen(name, sizeof(a->sun_path) - 2);
	memcpy(a->sun_path + 1, name, n); // sun_path[0] = 0: the abstract namespace
	return (socklen_t)(offsetof(sockaddr_un, sun_path) + 1 + n);
}

int listen_on(const char *name)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	sockaddr_un a;
	socklen_t len = addr_of(name, &a);
	if (fd < 0 || bind(fd, (sockaddr *)&a, len) || listen(fd, MAX_RANKS)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

int connect_to(const char *name)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	sockaddr_un a;
	socklen_t len = addr_of(name, &a);
	if (fd < 0 || connect(fd, (sockaddr *)&a, len)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

long now_ms()
{
	timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

// Waits until fd is readable or the deadline (ms since boot, < 0: none) passes.
bool wait_readable(int fd, long deadline)
{
	for (;;) {
		int left = deadline < 0 ? -1 : (int)(deadline - now_ms());
		if (deadline >= 0 && left <= 0)
			return false;
		pollfd p = {fd, POLLIN, 0};
		int r = poll(&p, 1, left);
		if (r > 0)
			return true;
		if (r < 0 && errno != EINTR)
			return false;
	}
}

// All of n bytes, or false (EOF, error, shutdown, deadline).
bool read_all(int fd, void *buf, size_t n, long deadline = -1)
{
	char *p = (char *)buf;
	while (n) {
		if (deadline >= 0 && !wait_readable(fd, deadline))
			return false;
		ssize_t r = recv(fd, p, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

bool write_all(int fd, const void *buf, size_t n)
{
	const char *p = (const char *)buf;
	while (n) {
		ssize_t r =
		    send(fd, p, n, MSG_NOSIGNAL); // a vanished peer is an error, not SIGPIPE
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

// The root of one id: collects the joins, answers with the table, exits.
void root_main(int lfd)
{
	long deadline = now_ms() + INIT_TIMEOUT_MS;
	std::vector<int> fds;
	std::vector<join_msg> joins;
	int nranks = 0;
	int32_t status = ncclSuccess;
	while (wait_readable(lfd, deadline)) {
		int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		join_msg j;
		if (!read_all(fd, &j, sizeof(j), now_ms() + 5000) || j.magic != MAGIC_JOIN ||
		    j.nranks < 1 || j.nranks > MAX_RANKS || j.rank < 0 || j.rank >= j.nranks ||
		    (nranks && j.nranks != nranks)) {
			close(fd);
			continue;
		}
		nranks = j.nranks;
		for (const join_msg &o : joins) {
			if (o.rank == j.rank)
				status = ncclInvalidUsage;
			if (o.pid == j.pid && o.device == j.device) {
				fprintf(stderr,
					"kvk-emu: ncclCommInitRank: duplicate GPU: ranks %d and %d "
					"both on device %d of process %d\n",
					o.rank, j.rank, j.device, j.pid);
				status = ncclInvalidUsage;
			}
		}
		fds.push_back(fd);
		joins.push_back(j);
		if ((int)joins.size() == nranks)
			break;
	}
	close(lfd);
	if ((int)joins.size() != nranks || !nranks)
		status = ncclSystemError; // timed out: every rank that joined hears so
	std::vector<peer_info> table((size_t)(nranks > 0 ? nranks : 1));
	for (const join_msg &j : joins) {
		table[(size_t)j.rank].device = j.device;
		table[(size_t)j.rank].pid = j.pid;
		memcpy(table[(size_t)j.rank].data, j.data, sizeof(j.data));
	}
	table_hdr h = {MAGIC_TABLE, status};
	for (int fd : fds) {
		if (write_all(fd, &h, sizeof(h)) && status == ncclSuccess)
			write_all(fd, table.data(), table.size() * sizeof(peer_info));
		close(fd);
	}
}

} // namespace

// Shared by the handle and the transfers in flight (shared_ptr): an aborted or destroyed
// communicator's handle is gone at once, its state when its last transfer ended.
struct comm_state {
	int rank = 0, nranks = 0, device = 0;
	std::vector<int> to, from;		  // sockets per peer: this rank sends on to[p]
	std::vector<std::mutex> send_mu, recv_mu; // one transfer per direction at a time
	std::atomic<bool> aborted{false};
	std::mutex mu;
	std::condition_variable cv;

	~comm_state()
	{
		for (int fd : to)
			if (fd >= 0)
				close(fd);
		for (int fd : from)
			if (fd >= 0)
				close(fd);
	}

	// A peer that went away: like an NCCL kernel, wait for the abort.
	void hang_until_abort()
	{
		std::unique_lock<std::mutex> l(mu);
		cv.wait(l, [this] { return aborted.load(); });
	}
};

struct ncclComm {
	std::shared_ptr<comm_state> s;
};

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	memset(id, 0, sizeof(*id));
	char name[96];
	unique_name(name, sizeof(name), "root");
	int lfd = listen_on(name);
	if (lfd < 0)
		return ncclSystemError;
	std::thread(root_main, lfd).detach();
	snprintf(id->internal, sizeof(id->internal), "%s%s", ID_PREFIX, name);
	return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
	*out = nullptr;
	if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	int dev = -1, n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess)
		return ncclUnhandledCudaError;
	char idstr[sizeof(id.internal) + 1];
	memcpy(idstr, id.internal, sizeof(id.internal));
	idstr[sizeof(id.internal)] = 0;
	if (strncmp(idstr, ID_PREFIX, sizeof(ID_PREFIX) - 1))
		return ncclInvalidArgument;
	auto s = std::make_shared<comm_state>();
	s->rank = rank;
	s->nranks = nranks;
	s->device = dev;
	s->to.assign((size_t)nranks, -1);
	s->from.assign((size_t)nranks, -1);
	s->send_mu = std::vector<std::mutex>((size_t)nranks);
	s->recv_mu = std::vector<std::mutex>((size_t)nranks);
	join_msg j = {MAGIC_JOIN, nranks, rank, dev, (int32_t)getpid(), {0}};
	unique_name(j.data, sizeof(j.data), "data");
	int lfd = listen_on(j.data), rfd = connect_to(idstr + sizeof(ID_PREFIX) - 1);
	long deadline = now_ms() + INIT_TIMEOUT_MS;
	table_hdr h = {0, ncclSystemError};
	std::vector<peer_info> table((size_t)nranks);
	bool ok = lfd >= 0 && rfd >= 0 && write_all(rfd, &j, sizeof(j)) &&
		  read_all(rfd, &h, sizeof(h), deadline) && h.magic == MAGIC_TABLE;
	ok = ok && h.status == ncclSuccess &&
	     read_all(rfd, table.data(), table.size() * sizeof(peer_info), deadline);
	if (rfd >= 0)
		close(rfd);
	// This rank's sending side to every peer, then the peers' sending sides to it.
	for (int p = 0; ok && p < nranks; p++) {
		if (p == rank)
			continue;
		char name[65];
		memcpy(name, table[(size_t)p].data, 64);
		name[64] = 0;
		hello_msg hm = {MAGIC_HELLO, rank};
		int fd = connect_to(name);
		ok = fd >= 0 && write_all(fd, &hm, sizeof(hm));
		s->to[(size_t)p] = fd;
	}
	for (int k = 0; ok && k < nranks - 1; k++) {
		ok = wait_readable(lfd, deadline);
		int fd = ok ? accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC) : -1;
		hello_msg hm;
		ok = fd >= 0 && read_all(fd, &hm, sizeof(hm), deadline) &&
		     hm.magic == MAGIC_HELLO && hm.rank >= 0 && hm.rank < nranks &&
		     hm.rank != rank && s->from[(size_t)hm.rank] < 0;
		if (ok)
			s->from[(size_t)hm.rank] = fd;
		else if (fd >= 0)
			close(fd);
	}
	if (lfd >= 0)
		close(lfd);
	if (!ok)
		return h.status != ncclSuccess ? (ncclResult_t)h.status : ncclSystemError;
	*out = new ncclComm{s};
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
	delete c; // its transfers in flight keep the state, and so the sockets
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
	if (!c)
		return ncclInvalidArgument;
	comm_state &s = *c->s;
	{
		std::lock_guard<std::mutex> l(s.mu);
		s.aborted = true;
		s.cv.notify_all();
	}
	for (int fd : s.to)
		if (fd >= 0)
			shutdown(fd, SHUT_RDWR);
	for (int fd : s.from)
		if (fd >= 0)
			shutdown(fd, SHUT_RDWR);
	delete c; // NCCL frees an aborted communicator
	return ncclSuccess;
}

namespace
{

size_t dtype_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8:
	case ncclUint8:
		return 1;
	case ncclFloat16:
		return 2;
	case ncclInt32:
	case ncclFloat32:
		return 4;
	}
	return 0;
}

// The end of a transfer whose socket failed: an abort (no error), or a peer that vanished.
cudaError_t broken(comm_state &s)
{
	if (!s.aborted)
		s.hang_until_abort();
	return cudaSuccess;
}

cudaError_t do_send(comm_state &s, int peer, const void *buf, size_t bytes)
{
	std::lock_guard<std::mutex> l(s.send_mu[(size_t)peer]);
	if (s.aborted)
		return cudaSuccess;
	int fd = s.to[(size_t)peer];
	data_hdr h = {MAGIC_DATA, 0, bytes};
	uint8_t ack = 0;
	if (!write_all(fd, &h, sizeof(h)) || !write_all(fd, buf, bytes) || !read_all(fd, &ack, 1))
		return broken(s);
	if (ack) {
		kvk_emu_fault(s.device, cudaErrorLaunchFailure,
			      "ncclSend of %zu bytes (rank %d) met an ncclRecv of another size "
			      "(rank %d)",
			      bytes, s.rank, peer);
		return cudaErrorLaunchFailure;
	}
	return cudaSuccess;
}

cudaError_t do_recv(comm_state &s, int peer, void *buf, size_t bytes)
{
	std::lock_guard<std::mutex> l(s.recv_mu[(size_t)peer]);
	if (s.aborted)
		return cudaSuccess;
	int fd = s.from[(size_t)peer];
	data_hdr h;
	if (!read_all(fd, &h, sizeof(h)) || h.magic != MAGIC_DATA)
		return broken(s);
	if (h.bytes != bytes) {
		std::vector<char> sink(1 << 16);
		for (uint64_t left = h.bytes; left;) { // drain it, so the sender reads the ack
			size_t k = left < sink.size() ? (size_t)left : sink.size();
			if (!read_all(fd, sink.data(), k))
				return broken(s);
			left -= k;
		}
		uint8_t ack = 1;
		write_all(fd, &ack, 1);
		kvk_emu_fault(
		    s.device, cudaErrorLaunchFailure,
		    "ncclRecv of %zu bytes (rank %d) met an ncclSend of %llu bytes (rank %d)",
		    bytes, s.rank, (unsigned long long)h.bytes, peer);
		return cudaErrorLaunchFailure;
	}
	uint8_t ack = 0;
	if (!read_all(fd, buf, bytes) || !write_all(fd, &ack, 1))
		return broken(s);
	return cudaSuccess;
}

ncclResult_t post(bool send, void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
		  cudaStream_t stream)
{
	size_t es = dtype_size(type);
	if (!c || peer < 0 || peer >= c->s->nranks || peer == c->s->rank || !es)
		return ncclInvalidArgument;
	const char *what = send ? "ncclSend" : "ncclRecv";
	size_t bytes = count * es;
	int dev = -1;
	if (kvk_emu_stream_device(stream) != c->s->device) {
		fprintf(stderr, "kvk-emu: %s: stream not on the communicator's device %d\n", what,
			c->s->device);
		return ncclInvalidUsage;
	}
	if (bytes && (!kvk_emu_is_device(buf, bytes, &dev) || dev != c->s->device)) {
		fprintf(stderr, "kvk-emu: %s: %p + %zu is not device memory of device %d\n", what,
			buf, bytes, c->s->device);
		return ncclInvalidArgument;
	}
	if (c->s->aborted)
		return ncclInvalidUsage;
	std::shared_ptr<comm_state> s = c->s;
	cudaError_t e = kvk_emu_stream_enqueue(stream, [s, send, peer, buf, bytes]() {
		return send ? do_send(*s, peer, buf, bytes) : do_recv(*s, peer, buf, bytes);
	});
	return e == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

} // namespace

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
		      cudaStream_t stream)
{
	return post(true, (void *)buf, count, type, peer, c, stream);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
		      cudaStream_t stream)
{
	return post(false, buf, count, type, peer, c, stream);
}

const char *ncclGetErrorString(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess:
		return "no error";
	case ncclUnhandledCudaError:
		return "unhandled cuda error";
	case ncclSystemError:
		return "unhandled system error";
	case ncclInternalError:
		return "internal error";
	case ncclInvalidArgument:
		return "invalid argument";
	case ncclInvalidUsage:
		return "invalid usage";
	case ncclRemoteError:
		return "remote process exited or there was a network error";
	}
	return "unknown result code";
}
