// The emulated NCCL (nccl.h): the ranks of a communicator live in one process (threads, one
// device each); ncclCommInitRank blocks until all joined, as NCCL does. A send and the receive
// of its peer meet on their streams' workers in posting order per (sender, receiver); the
// second to arrive copies. Locks: g_mu the table of groups being formed; each group's mu its
// ranks and queues.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nccl.h"

namespace
{

struct op {
	void *buf;
	size_t bytes;
	int state = 0; // 0 posted, 1 done, 2 failed (abort or size mismatch)
};

struct group {
	std::mutex mu;
	std::condition_variable cv;
	int nranks = 0, joined = 0;
	std::vector<int> device; // per rank, -1 until joined
	bool failed = false;	 // init failed (duplicate device); every rank returns an error
	bool aborted = false;
	std::map<std::pair<int, int>, std::deque<std::shared_ptr<op>>> sends, recvs;
};

std::mutex g_mu;
std::map<std::string, std::shared_ptr<group>> g_forming;
std::atomic<unsigned long> g_ids{0};

constexpr int INIT_TIMEOUT_S = 120;

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

} // namespace

struct ncclComm {
	std::shared_ptr<group> g;
	int rank, nranks, device;
};

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	memset(id, 0, sizeof(*id));
	snprintf(id->internal, sizeof(id->internal), "kvk-emu-nccl %ld %lu %ld", (long)getpid(),
		 g_ids.fetch_add(1), (long)random());
	return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
	*out = nullptr;
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	int dev = -1, n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess)
		return ncclUnhandledCudaError;
	std::string key(id.internal, sizeof(id.internal));
	std::shared_ptr<group> g;
	{
		std::lock_guard<std::mutex> l(g_mu);
		auto &slot = g_forming[key];
		if (!slot) {
			slot = std::make_shared<group>();
			slot->nranks = nranks;
			slot->device.assign((size_t)nranks, -1);
		}
		g = slot;
	}
	std::unique_lock<std::mutex> l(g->mu);
	if (g->nranks != nranks || g->device[(size_t)rank] >= 0) {
		fprintf(stderr,
			"kvk-emu: ncclCommInitRank: rank %d of %d joins twice or with another "
			"size\n",
			rank, nranks);
		return ncclInvalidUsage;
	}
	for (int r = 0; r < nranks; r++)
		if (g->device[(size_t)r] == dev) {
			fprintf(stderr,
				"kvk-emu: ncclCommInitRank: duplicate GPU: ranks %d and %d both "
				"on device %d\n",
				r, rank, dev);
			g->failed = true;
			g->cv.notify_all();
			return ncclInvalidUsage;
		}
	g->device[(size_t)rank] = dev;
	if (++g->joined == nranks) {
		g->cv.notify_all();
		std::lock_guard<std::mutex> f(g_mu);
		g_forming.erase(key);
	}
	bool ok = g->cv.wait_for(l, std::chrono::seconds(INIT_TIMEOUT_S),
				 [&] { return g->failed || g->joined == nranks; });
	if (!ok || g->failed)
		return ok ? ncclInvalidUsage : ncclSystemError;
	*out = new ncclComm{g, rank, nranks, dev};
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
	delete c; // pending operations keep the group alive through their tasks
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
	if (!c)
		return ncclInvalidArgument;
	{
		std::lock_guard<std::mutex> l(c->g->mu);
		c->g->aborted = true;
		for (auto *m : {&c->g->sends, &c->g->recvs})
			for (auto &q : *m)
				for (auto &o : q.second)
					o->state = 2;
		c->g->cv.notify_all();
	}
	delete c; // NCCL frees an aborted communicator
	return ncclSuccess;
}

static ncclResult_t post(bool send, void *buf, size_t count, ncclDataType_t type, int peer,
			 ncclComm_t c, cudaStream_t stream)
{
	size_t es = dtype_size(type);
	if (!c || peer < 0 || peer >= c->nranks || peer == c->rank || !es)
		return ncclInvalidArgument;
	int dev = -1;
	size_t bytes = count * es;
	if (kvk_emu_stream_device(stream) != c->device) {
		fprintf(stderr, "kvk-emu: %s: stream not on the communicator's device %d\n",
			send ? "ncclSend" : "ncclRecv", c->device);
		return ncclInvalidUsage;
	}
	if (bytes && (!kvk_emu_is_device(buf, bytes, &dev) || dev != c->device)) {
		fprintf(stderr, "kvk-emu: %s: %p + %zu is not device memory of device %d\n",
			send ? "ncclSend" : "ncclRecv", buf, bytes, c->device);
		return ncclInvalidArgument;
	}
	{
		std::lock_guard<std::mutex> l(c->g->mu);
		if (c->g->aborted)
			return ncclInvalidUsage;
	}
	std::shared_ptr<group> g = c->g;
	int from = send ? c->rank : peer, to = send ? peer : c->rank, mydev = c->device;
	cudaError_t e = kvk_emu_stream_enqueue(stream, [=]() {
		auto me = std::make_shared<op>();
		me->buf = buf;
		me->bytes = bytes;
		std::unique_lock<std::mutex> l(g->mu);
		auto &mine = send ? g->sends[{from, to}] : g->recvs[{from, to}];
		auto &theirs = send ? g->recvs[{from, to}] : g->sends[{from, to}];
		if (g->aborted)
			return cudaSuccess; // an aborted operation ends without data, not a fault
		if (theirs.empty()) {
			mine.push_back(me);
			g->cv.wait(l, [&] { return me->state != 0; });
		} else {
			std::shared_ptr<op> other = theirs.front();
			theirs.pop_front();
			if (other->bytes != bytes) {
				other->state = me->state = 2;
				g->cv.notify_all();
				int od = g->device[(size_t)(send ? to : from)];
				l.unlock();
				const char *fmt =
				    "ncclSend of %zu bytes (rank %d) met ncclRecv of %zu "
				    "bytes (rank %d)";
				size_t sb = send ? bytes : other->bytes,
				       rb = send ? other->bytes : bytes;
				kvk_emu_fault(od, cudaErrorLaunchFailure, fmt, sb, from, rb, to);
				kvk_emu_fault(mydev, cudaErrorLaunchFailure, fmt, sb, from, rb, to);
				return cudaErrorLaunchFailure;
			}
			memcpy(send ? other->buf : buf, send ? buf : other->buf, bytes);
			other->state = me->state = 1;
			g->cv.notify_all();
		}
		if (me->state == 2 && !g->aborted)
			return cudaErrorLaunchFailure; // the peer met a size mismatch
		return cudaSuccess;
	});
	return e == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

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
