// The emulated CUDA runtime (cuda_runtime.h): devices, device and pinned memory, streams as
// worker threads, events, launches, errors. Locks: g_amu protects the allocation table; each
// device's mu its stream list, byte count and function attributes; each stream's and event's
// mu its own queue or counters. No lock is held while a task runs or while waiting on another
// object's lock.
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kvk_emu_int.h"

namespace
{

constexpr size_t SMEM_DEFAULT = 48u << 10;
constexpr int SMEM_OPTIN = 232448; // Hopper's per-block opt-in limit (227 KiB)
constexpr int MAX_DEVICES = 16;

struct task {
	std::function<cudaError_t()> fn;
	bool always; // runs even after the device faulted (event bookkeeping), so no one hangs
};

struct device {
	std::atomic<int> sticky{cudaSuccess};
	std::mutex mu;
	std::vector<CUstream_st *> streams; // live ones, the legacy stream included
	CUstream_st *legacy = nullptr;
	size_t used = 0, limit = 0;
	std::map<const void *, int> max_dyn_smem;
};

struct alloc_rec {
	size_t size;
	int device; // -1: pinned host memory
};

std::mutex g_amu;
std::map<uintptr_t, alloc_rec> g_allocs;
std::mutex g_smu;
std::set<const CUstream_st *> g_streams; // every live stream, for handle checks
int g_ndev;
device *g_dev; // never freed: stream workers may outlive static destruction at exit
std::once_flag g_once;
std::atomic<uint64_t> g_jitter{0};
thread_local int t_dev = 0;
thread_local cudaError_t t_last = cudaSuccess;

void init_once()
{
	const char *e = getenv("KVK_EMU_DEVICES");
	int n = e && *e ? atoi(e) : 1;
	g_ndev = n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
	const char *m = getenv("KVK_EMU_MEM_MB");
	long mb = m && *m ? atol(m) : 4096;
	const char *j = getenv("KVK_EMU_JITTER");
	g_jitter = j && *j ? strtoull(j, nullptr, 0) : 0;
	g_dev = new device[MAX_DEVICES];
	for (int i = 0; i < MAX_DEVICES; i++)
		g_dev[i].limit = (size_t)(mb > 0 ? mb : 4096) << 20;
}

void init()
{
	std::call_once(g_once, init_once);
}

cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess)
		t_last = e;
	return e;
}

cudaError_t sticky(int dev)
{
	return (cudaError_t)g_dev[dev].sticky.load(std::memory_order_acquire);
}

__attribute__((format(printf, 1, 2))) void say(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "kvk-emu: %s\n", msg);
}

// The allocation holding [p, p + n), or NULL. Caller holds g_amu.
const alloc_rec *find_locked(const void *p, size_t n, uintptr_t *base)
{
	uintptr_t a = (uintptr_t)p;
	auto it = g_allocs.upper_bound(a);
	if (it == g_allocs.begin())
		return nullptr;
	--it;
	if (a - it->first >= it->second.size || n > it->second.size - (a - it->first))
		return nullptr;
	if (base)
		*base = it->first;
	return &it->second;
}

// -1: not inside any allocation; -2: pinned host memory; else the device of the
// allocation holding [p, p + n) (n = 1 asks where p points).
int where(const void *p, size_t n)
{
	std::lock_guard<std::mutex> l(g_amu);
	const alloc_rec *r = find_locked(p, n ? n : 1, nullptr);
	if (!r)
		return -1;
	return r->device < 0 ? -2 : r->device;
}

} // namespace

// ---- streams ------------------------------------------------------------------------------------

struct CUstream_st {
	int device;
	std::mutex mu;
	std::condition_variable cv;
	std::deque<task> q;
	uint64_t enq = 0, done = 0;
	bool stop = false;
	std::thread th;

	uint64_t rng; // jitter: this worker's random state

	explicit CUstream_st(int dev) : device(dev), rng((uint64_t)(uintptr_t)this | 1)
	{
		th = std::thread([this] { run(); });
	}

	void run()
	{
		for (;;) {
			task t;
			{
				std::unique_lock<std::mutex> l(mu);
				cv.wait(l, [this] { return stop || !q.empty(); });
				if (q.empty())
					return;
				t = std::move(q.front());
				q.pop_front();
			}
			uint64_t jit = g_jitter.load(std::memory_order_relaxed);
			if (jit) { // half the tasks start up to 300 us late
				rng ^= jit;
				uint64_t r = kvk_emu_rand(&rng);
				if (r & 1)
					usleep((useconds_t)(r >> 1) % 300);
			}
			if (t.always || sticky(device) == cudaSuccess) {
				cudaError_t e = t.fn();
				if (e != cudaSuccess) {
					int ok = cudaSuccess;
					g_dev[device].sticky.compare_exchange_strong(ok, e);
				}
			}
			std::lock_guard<std::mutex> l(mu);
			done++;
			cv.notify_all();
		}
	}

	void push(std::function<cudaError_t()> fn, bool always = false)
	{
		std::lock_guard<std::mutex> l(mu);
		q.push_back(task{std::move(fn), always});
		enq++;
		cv.notify_all();
	}

	// Waits for everything enqueued before the call.
	void drain()
	{
		std::unique_lock<std::mutex> l(mu);
		uint64_t target = enq;
		cv.wait(l, [&] { return done >= target; });
	}
};

namespace
{

CUstream_st *legacy(int dev)
{
	std::lock_guard<std::mutex> l(g_dev[dev].mu);
	if (!g_dev[dev].legacy) {
		g_dev[dev].legacy = new CUstream_st(dev); // kept for the process's life
		g_dev[dev].legacy->th.detach();
		g_dev[dev].streams.push_back(g_dev[dev].legacy);
		std::lock_guard<std::mutex> s(g_smu);
		g_streams.insert(g_dev[dev].legacy);
	}
	return g_dev[dev].legacy;
}

// The stream behind a handle (0: the current device's legacy stream), or NULL for a handle
// that is not a live stream.
CUstream_st *resolve(cudaStream_t s)
{
	init();
	if (!s)
		return t_dev < g_ndev ? legacy(t_dev) : nullptr;
	std::lock_guard<std::mutex> l(g_smu);
	return g_streams.count(s) ? s : nullptr;
}

void drain_device(int dev)
{
	std::vector<CUstream_st *> v;
	{
		std::lock_guard<std::mutex> l(g_dev[dev].mu);
		v = g_dev[dev].streams;
	}
	for (CUstream_st *s : v)
		s->drain();
}

bool no_device()
{
	init();
	return t_dev >= g_ndev;
}

} // namespace

// ---- events
// ---------------------------------------------------------------------------------------

struct CUevent_st {
	int device;
	std::mutex mu;
	std::condition_variable cv;
	uint64_t recorded = 0, completed = 0;

	void wait_for(uint64_t g)
	{
		std::unique_lock<std::mutex> l(mu);
		cv.wait(l, [&] { return completed >= g; });
	}
};

// ---- devices and errors
// -----------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int *count)
{
	init();
	*count = g_ndev;
	return g_ndev ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
	init();
	if (device < 0 || device >= g_ndev)
		return ret(cudaErrorInvalidDevice);
	t_dev = device;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
	init();
	*device = t_dev;
	return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
	init();
	if (device < 0 || device >= g_ndev)
		return ret(cudaErrorInvalidDevice);
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "kvk-emu %d (CUDA emulated on the CPU, not a GPU)",
		 device);
	p->totalGlobalMem = g_dev[device].limit;
	p->sharedMemPerBlock = SMEM_DEFAULT;
	p->sharedMemPerBlockOptin = SMEM_OPTIN;
	p->warpSize = 32;
	p->maxThreadsPerBlock = 1024;
	p->major = 9;
	p->minor = 0;
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	p->multiProcessorCount = n > 0 ? (int)n : 1;
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
	if (no_device())
		return ret(cudaErrorNoDevice);
	drain_device(t_dev);
	return ret(sticky(t_dev));
}

cudaError_t cudaGetLastError(void)
{
	init();
	cudaError_t e = t_last;
	t_last = cudaSuccess;
	if (e == cudaSuccess && t_dev < g_ndev)
		e = sticky(t_dev); // a fault is sticky: never cleared
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	init();
	if (t_last == cudaSuccess && t_dev < g_ndev)
		return sticky(t_dev);
	return t_last;
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "no error";
	case cudaErrorInvalidValue:
		return "invalid argument";
	case cudaErrorMemoryAllocation:
		return "out of memory";
	case cudaErrorInvalidConfiguration:
		return "invalid configuration argument";
	case cudaErrorInvalidDevice:
		return "invalid device ordinal";
	case cudaErrorNoDevice:
		return "no CUDA-capable device is detected";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle";
	case cudaErrorIllegalAddress:
		return "an illegal memory access was encountered";
	case cudaErrorLaunchFailure:
		return "unspecified launch failure";
	case cudaErrorNotSupported:
		return "operation not supported";
	}
	return "unknown error";
}

void kvk_emu_fault(int dev, cudaError_t e, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "kvk-emu: device %d fault (%s): %s\n", dev, cudaGetErrorString(e), msg);
	int ok = cudaSuccess;
	g_dev[dev].sticky.compare_exchange_strong(ok, e);
}

// ---- memory
// -------------------------------------------------------------------------------------------

cudaError_t kvk_emu_malloc(void **p, size_t bytes)
{
	*p = nullptr;
	if (no_device())
		return ret(cudaErrorNoDevice);
	int dev = t_dev;
	if (sticky(dev))
		return ret(sticky(dev));
	if (!bytes)
		return cudaSuccess;
	{
		std::lock_guard<std::mutex> l(g_dev[dev].mu);
		if (bytes > g_dev[dev].limit - g_dev[dev].used)
			return ret(cudaErrorMemoryAllocation);
		g_dev[dev].used += bytes;
	}
	void *m = nullptr;
	if (posix_memalign(&m, 256, bytes)) { // CUDA's alignment; the exact size for ASan
		std::lock_guard<std::mutex> l(g_dev[dev].mu);
		g_dev[dev].used -= bytes;
		return ret(cudaErrorMemoryAllocation);
	}
	memset(m, 0xff, bytes); // NaN as f32 and f16: reads of memory never written show
	std::lock_guard<std::mutex> l(g_amu);
	g_allocs[(uintptr_t)m] = alloc_rec{bytes, dev};
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	init();
	alloc_rec r;
	{
		std::lock_guard<std::mutex> l(g_amu);
		auto it = g_allocs.find((uintptr_t)p);
		if (it == g_allocs.end() || it->second.device < 0) {
			say("cudaFree(%p): not the start of a device allocation", p);
			return ret(cudaErrorInvalidValue);
		}
		r = it->second;
	}
	drain_device(r.device); // cudaFree waits for the device, as on a GPU
	{
		std::lock_guard<std::mutex> l(g_amu);
		g_allocs.erase((uintptr_t)p);
	}
	{
		std::lock_guard<std::mutex> l(g_dev[r.device].mu);
		g_dev[r.device].used -= r.size;
	}
	memset(p, 0xff, r.size);
	free(p);
	return cudaSuccess;
}

cudaError_t kvk_emu_host_alloc(void **p, size_t bytes, unsigned flags)
{
	*p = nullptr;
	(void)flags;
	if (no_device())
		return ret(cudaErrorNoDevice);
	void *m = nullptr;
	if (posix_memalign(&m, 4096, bytes ? bytes : 1))
		return ret(cudaErrorMemoryAllocation);
	std::lock_guard<std::mutex> l(g_amu);
	g_allocs[(uintptr_t)m] = alloc_rec{bytes ? bytes : 1, -1};
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
	if (!p)
		return cudaSuccess;
	init();
	{
		std::lock_guard<std::mutex> l(g_amu);
		auto it = g_allocs.find((uintptr_t)p);
		if (it == g_allocs.end() || it->second.device >= 0) {
			say("cudaFreeHost(%p): not the start of a pinned allocation", p);
			return ret(cudaErrorInvalidValue);
		}
	}
	for (int d = 0; d < g_ndev; d++) // copies in flight may still use it
		drain_device(d);
	std::lock_guard<std::mutex> l(g_amu);
	g_allocs.erase((uintptr_t)p);
	free(p);
	return cudaSuccess;
}

int kvk_emu_is_device(const void *p, size_t bytes, int *dev)
{
	init();
	int w = where(p, bytes);
	if (w < 0)
		return 0;
	if (dev)
		*dev = w;
	return 1;
}

namespace
{

const char *kind_name(cudaMemcpyKind k)
{
	static const char *n[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice",
				  "Default"};
	return (unsigned)k < 5 ? n[k] : "?";
}

// Checks one side of a copy: `dev_side` says whether the kind puts it in device memory.
// Returns 0 if fine; else an error already reported (and, for a device range that runs
// past its allocation, made the device's sticky error: the GPU would fault).
cudaError_t check_side(const char *call, cudaMemcpyKind kind, const char *side, const void *p,
		       size_t n, bool dev_side, int dev)
{
	int start = where(p, 1), whole = where(p, n);
	if (dev_side) {
		if (start < 0) {
			say("%s(%s): %s %p is not device memory", call, kind_name(kind), side, p);
			return cudaErrorInvalidValue;
		}
		if (whole < 0) {
			kvk_emu_fault(start, cudaErrorIllegalAddress,
				      "%s(%s): %s %p + %zu bytes runs past its allocation", call,
				      kind_name(kind), side, p, n);
			return cudaErrorIllegalAddress;
		}
	} else if (start >= 0) {
		say("%s(%s): %s %p is device memory (of device %d), not host memory", call,
		    kind_name(kind), side, p, start);
		return cudaErrorInvalidValue;
	}
	(void)dev;
	return cudaSuccess;
}

cudaError_t copy_async(const char *call, void *dst, const void *src, size_t n, cudaMemcpyKind kind,
		       cudaStream_t stream, bool sync)
{
	CUstream_st *s = resolve(stream);
	if (!s) {
		if (no_device())
			return ret(cudaErrorNoDevice);
		say("%s: %p is not a live stream", call, (void *)stream);
		return ret(cudaErrorInvalidResourceHandle);
	}
	if (sticky(s->device))
		return ret(sticky(s->device));
	if (!n)
		return cudaSuccess;
	if (kind == cudaMemcpyDefault)
		kind =
		    (cudaMemcpyKind)((where(src, 1) >= 0 ? 2 : 0) | (where(dst, 1) >= 0 ? 1 : 0));
	if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
		return ret(cudaErrorInvalidValue);
	bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
	bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	cudaError_t e = check_side(call, kind, "dst", dst, n, dst_dev, s->device);
	if (!e)
		e = check_side(call, kind, "src", src, n, src_dev, s->device);
	if (e)
		return ret(e);
	if (kind == cudaMemcpyHostToDevice && where(src, n) != -2) {
		// Pageable source: staged now, so the caller may reuse it on return.
		auto stage = std::make_shared<std::vector<unsigned char>>(
		    (const unsigned char *)src, (const unsigned char *)src + n);
		s->push([dst, stage] {
			memcpy(dst, stage->data(), stage->size());
			return cudaSuccess;
		});
	} else {
		s->push([dst, src, n] {
			memcpy(dst, src, n);
			return cudaSuccess;
		});
	}
	// To pageable memory (or asked for): returns once the copy is done.
	if (sync || (kind == cudaMemcpyDeviceToHost && where(dst, n) != -2) ||
	    kind == cudaMemcpyHostToHost) {
		s->drain();
		return ret(sticky(s->device));
	}
	return cudaSuccess;
}

} // namespace

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
			    cudaStream_t stream)
{
	return copy_async("cudaMemcpyAsync", dst, src, bytes, kind, stream, false);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
	return copy_async("cudaMemcpy", dst, src, bytes, kind, 0, true);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream)
{
	CUstream_st *s = resolve(stream);
	if (!s)
		return ret(no_device() ? cudaErrorNoDevice : cudaErrorInvalidResourceHandle);
	if (sticky(s->device))
		return ret(sticky(s->device));
	if (!bytes)
		return cudaSuccess;
	cudaError_t e = check_side("cudaMemsetAsync", cudaMemcpyHostToDevice, "dst", dst, bytes,
				   true, s->device);
	if (e)
		return ret(e);
	s->push([dst, value, bytes] {
		memset(dst, value, bytes);
		return cudaSuccess;
	});
	return cudaSuccess;
}

// ---- streams and events (API)
// ------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags)
{
	*out = nullptr;
	if (no_device())
		return ret(cudaErrorNoDevice);
	if (flags != cudaStreamNonBlocking) {
		// A blocking stream synchronizes with the legacy stream; not modelled.
		say("cudaStreamCreateWithFlags(%#x): only cudaStreamNonBlocking is emulated",
		    flags);
		return ret(cudaErrorNotSupported);
	}
	CUstream_st *s = new CUstream_st(t_dev);
	{
		std::lock_guard<std::mutex> l(g_dev[t_dev].mu);
		g_dev[t_dev].streams.push_back(s);
	}
	std::lock_guard<std::mutex> l(g_smu);
	g_streams.insert(s);
	*out = s;
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	init();
	CUstream_st *s = stream ? resolve(stream) : nullptr;
	if (!s || s == g_dev[s->device].legacy)
		return ret(cudaErrorInvalidResourceHandle);
	{
		std::lock_guard<std::mutex> l(g_smu);
		g_streams.erase(s);
	}
	{
		std::lock_guard<std::mutex> l(g_dev[s->device].mu);
		auto &v = g_dev[s->device].streams;
		v.erase(std::remove(v.begin(), v.end(), s), v.end());
	}
	// Its work completes first (CUDA lets it finish after the call returns).
	{
		std::lock_guard<std::mutex> l(s->mu);
		s->stop = true;
		s->cv.notify_all();
	}
	s->th.join();
	delete s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	CUstream_st *s = resolve(stream);
	if (!s)
		return ret(no_device() ? cudaErrorNoDevice : cudaErrorInvalidResourceHandle);
	s->drain();
	return ret(sticky(s->device));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags)
{
	(void)flags;
	*ev = nullptr;
	if (no_device())
		return ret(cudaErrorNoDevice);
	CUevent_st *e = new CUevent_st();
	e->device = t_dev;
	*ev = e;
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	uint64_t g;
	{
		std::lock_guard<std::mutex> l(ev->mu);
		g = ev->recorded;
	}
	ev->wait_for(g); // CUDA frees it once its last record completes
	delete ev;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream)
{
	CUstream_st *s = resolve(stream);
	if (!ev || !s)
		return ret(cudaErrorInvalidResourceHandle);
	if (ev->device != s->device) {
		say("cudaEventRecord: event of device %d on a stream of device %d", ev->device,
		    s->device);
		return ret(cudaErrorInvalidResourceHandle);
	}
	uint64_t g;
	{
		std::lock_guard<std::mutex> l(ev->mu);
		g = ++ev->recorded;
	}
	s->push(
	    [ev, g] {
		    std::lock_guard<std::mutex> l(ev->mu);
		    ev->completed = std::max(ev->completed, g);
		    ev->cv.notify_all();
		    return cudaSuccess;
	    },
	    true);
	return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev, unsigned flags)
{
	CUstream_st *s = resolve(stream);
	if (!ev || !s || flags)
		return ret(flags ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
	uint64_t g;
	{
		std::lock_guard<std::mutex> l(ev->mu);
		g = ev->recorded; // the record most recent at the call; none: nothing to wait for
	}
	if (g)
		s->push(
		    [ev, g] {
			    ev->wait_for(g);
			    return cudaSuccess;
		    },
		    true);
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	uint64_t g;
	{
		std::lock_guard<std::mutex> l(ev->mu);
		g = ev->recorded;
	}
	ev->wait_for(g);
	return ret(sticky(ev->device));
}

int kvk_emu_stream_device(cudaStream_t stream)
{
	CUstream_st *s = resolve(stream);
	return s ? s->device : -1;
}

cudaError_t kvk_emu_stream_enqueue(cudaStream_t stream, std::function<cudaError_t()> fn)
{
	CUstream_st *s = resolve(stream);
	if (!s)
		return ret(cudaErrorInvalidResourceHandle);
	if (sticky(s->device))
		return ret(sticky(s->device));
	s->push(std::move(fn));
	return cudaSuccess;
}

// ---- launches
// -------------------------------------------------------------------------------------------

uint64_t kvk_emu_jitter(void)
{
	init();
	return g_jitter.load(std::memory_order_relaxed);
}

void kvk_emu_set_jitter(uint64_t seed)
{
	init();
	g_jitter = seed;
}

cudaError_t kvk_emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value)
{
	if (no_device())
		return ret(cudaErrorNoDevice);
	if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > SMEM_OPTIN)
		return ret(cudaErrorInvalidValue);
	std::lock_guard<std::mutex> l(g_dev[t_dev].mu);
	g_dev[t_dev].max_dyn_smem[fn] = value;
	return cudaSuccess;
}

void kvk_emu_launch_body(const char *name, const void *fn, const kvk_emu_cfg &cfg,
			 std::function<void()> body)
{
	if (no_device()) {
		ret(cudaErrorNoDevice);
		return;
	}
	int dev = t_dev;
	if (sticky(dev)) {
		ret(sticky(dev));
		return;
	}
	CUstream_st *s = resolve(cfg.stream);
	if (!s) {
		say("launch of %s: %p is not a live stream", name, (void *)cfg.stream);
		ret(cudaErrorInvalidResourceHandle);
		return;
	}
	if (s->device != dev) {
		say("launch of %s on a stream of device %d while device %d is current", name,
		    s->device, dev);
		ret(cudaErrorInvalidResourceHandle);
		return;
	}
	const dim3 &g = cfg.grid, &b = cfg.block;
	unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
	if (!g.x || !g.y || !g.z || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535 || !threads ||
	    b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024) {
		say("launch of %s: grid (%u,%u,%u) block (%u,%u,%u) exceeds the device's limits",
		    name, g.x, g.y, g.z, b.x, b.y, b.z);
		ret(cudaErrorInvalidConfiguration);
		return;
	}
	// Static and dynamic together: 48 KiB, or the opt-in limit for a kernel whose dynamic
	// limit was set (CUDA checks the static part then; here it is known when a block runs).
	size_t smem_max = SMEM_DEFAULT, smem_total = SMEM_DEFAULT;
	{
		std::lock_guard<std::mutex> l(g_dev[dev].mu);
		auto it = g_dev[dev].max_dyn_smem.find(fn);
		if (it != g_dev[dev].max_dyn_smem.end()) {
			smem_max = (size_t)it->second;
			smem_total = SMEM_OPTIN;
		}
	}
	if (cfg.smem > smem_max) {
		say("launch of %s: %zu bytes of dynamic shared memory, the limit for it is %zu "
		    "(cudaFuncAttributeMaxDynamicSharedMemorySize)",
		    name, cfg.smem, smem_max);
		ret(cudaErrorInvalidValue);
		return;
	}
	kvk_emu_cfg c = cfg;
	uint64_t jit = kvk_emu_jitter(); // as at the launch: the grid runs later, on the stream
	s->push([name, c, jit, smem_total, body = std::move(body)] {
		return kvk_emu_run_grid(name, c, body, jit, smem_total);
	});
}
