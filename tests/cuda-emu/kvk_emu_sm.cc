// Thread blocks as fibers (kvk_emu.h): one fiber per CUDA thread on the worker thread of the
// stream that runs the grid. A fiber runs until it reaches a barrier (__syncthreads or a warp
// operation) that others have not reached yet, then the scheduler runs the next runnable one;
// the last to arrive releases the others and goes on. No runnable fiber while some have not
// finished is a barrier that cannot complete: a kernel fault, reported with who waits where.
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <vector>

#include "kvk_emu_int.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef KVK_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

__thread kvk_emu_lane *kvk_emu_cur;

namespace
{

// 128 KiB of stack per CUDA thread (kernels keep small arrays; sanitizers grow frames), and
// a guard page under it so an overflow faults instead of corrupting the next stack.
constexpr size_t STACK_BYTES = 128u << 10;
constexpr size_t GUARD_BYTES = 4096;
constexpr int MAX_THREADS = 1024;
// Static shared memory: what a block may declare (CUDA's static limit), and the arena that
// holds it with a red zone after each variable (the red zones do not count against the limit).
constexpr size_t STATIC_SMEM_MAX = 48u << 10;
constexpr size_t SMEM_REDZONE = 32;
constexpr size_t SMEM_ARENA = 64u << 10;

enum fstate { F_RUN, F_BAR, F_WARP, F_DONE };

struct fiber {
	void *sp = nullptr; // saved stack pointer while switched out
	char *stack = nullptr;
	int state = F_DONE;
	int warp = 0, lane = 0;
	int dirty = 0; // abandoned mid-kernel: its stack's shadow is stale (ASan)
	void *fake = nullptr;
	void *tsan = nullptr; // its TSan fiber (TSan builds)
	char tsan_name[64] = {};
	kvk_emu_lane info = {};
};

struct warp {
	unsigned exist = 0;   // lanes present in the block
	unsigned exited = 0;  // lanes that returned
	unsigned arrived = 0; // lanes waiting in the pending operation
	unsigned gen = 0;     // operations completed
	int op = 0, width = 0;
	unsigned mask = 0;
	uint64_t val[2][32] = {}; // by generation parity: a lane is at most one operation ahead
	char sync[2] = {};	  // TSan: __syncwarp's release/acquire address, by parity
};

struct static_var {
	const void *site;
	size_t off;
};

// Dynamic shared memory starts 128-byte aligned, as a block's shared window does on a GPU when
// the kernel has no static shared memory (wmma::load_matrix_sync needs 32-byte pointers).
template <typename T> struct smem_alloc {
	using value_type = T;
	smem_alloc() = default;
	template <typename U> smem_alloc(const smem_alloc<U> &)
	{
	}
	T *allocate(size_t n)
	{
		return (T *)::operator new(n * sizeof(T), std::align_val_t(128));
	}
	void deallocate(T *p, size_t)
	{
		::operator delete(p, std::align_val_t(128));
	}
	bool operator==(const smem_alloc &) const
	{
		return true;
	}
	bool operator!=(const smem_alloc &) const
	{
		return false;
	}
};

struct sm {
	std::vector<fiber> fibers;
	std::vector<warp> warps;
	std::vector<int> runq; // ring buffer of fiber indices
	size_t rq_head = 0, rq_len = 0;
	void *sched_sp = nullptr;
	const void *sched_bottom = nullptr;
	size_t sched_size = 0;
	void *sched_fake = nullptr;
	fiber *cur = nullptr;
	kvk_emu_block blk = {};
	std::vector<unsigned char, smem_alloc<unsigned char>> smem;
	// This block's static shared variables, in the order they were reached.
	std::vector<static_var> svars;
	unsigned char *sarena = nullptr; // SMEM_ARENA bytes
	size_t s_used = 0, s_end = 0;	 // bytes declared (as CUDA counts them); arena in use
	size_t smem_limit = 0;		 // static + dynamic, for this launch
	int n = 0, alive = 0, bar_arrived = 0;
	const std::function<void()> *body = nullptr;
	const char *kname = "";
	cudaError_t fault = cudaSuccess;
	uint64_t rng = 0; // jitter: 0 runs fibers and blocks in order
	// TSan (docs/cuda-emu.md, "Races"): the worker thread's own fiber, and the addresses
	// whose release/acquire order the CUDA threads: block start, block end, __syncthreads
	// by generation parity.
	void *tsan_sched = nullptr;
	char sync_start = 0, sync_end = 0, sync_bar[2] = {};
	unsigned bar_gen = 0;

	~sm()
	{
#ifdef KVK_EMU_TSAN
		for (fiber &f : fibers)
			if (f.tsan)
				__tsan_destroy_fiber(f.tsan);
#endif
		if (sarena) {
#ifdef EMU_ASAN
			__asan_unpoison_memory_region(sarena, SMEM_ARENA);
#endif
			free(sarena);
		}
		for (fiber &f : fibers)
			if (f.stack)
				munmap(f.stack - GUARD_BYTES, STACK_BYTES + GUARD_BYTES);
	}
};

thread_local sm *t_sm;

sm *sm_get()
{
	static thread_local std::unique_ptr<sm> own;
	if (!own)
		own.reset(new sm());
	return own.get();
}

} // namespace

// ---- context switch
// ------------------------------------------------------------------------------
// kvk_emu_switch(save, to): saves the callee-saved registers and the FP control words on the
// current stack, stores its stack pointer in *save, and resumes the context whose stack
// pointer is `to`. A fresh fiber's stack is prepared so that this "returns" into
// kvk_emu_fiber_entry with the fiber in r12.
extern "C" void kvk_emu_switch(void **save, void *to);
extern "C" void kvk_emu_fiber_entry(void);
extern "C" void kvk_emu_fiber_main(fiber *f);

#if defined(__x86_64__)
asm(R"(
	.text
	.globl kvk_emu_switch
	.type kvk_emu_switch, @function
kvk_emu_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	subq $8, %rsp
	stmxcsr (%rsp)
	fnstcw 4(%rsp)
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	ldmxcsr (%rsp)
	fldcw 4(%rsp)
	addq $8, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size kvk_emu_switch, .-kvk_emu_switch

	.globl kvk_emu_fiber_entry
	.type kvk_emu_fiber_entry, @function
kvk_emu_fiber_entry:
	movq %r12, %rdi
	call kvk_emu_fiber_main@PLT
	ud2
	.size kvk_emu_fiber_entry, .-kvk_emu_fiber_entry
	.section .note.GNU-stack,"",@progbits
	.text
)");

static void *stack_prepare(fiber *f)
{
	// After the switch's `ret` into the entry, rsp must be 16-byte aligned (the entry's
	// `call` then leaves the ABI's alignment for kvk_emu_fiber_main).
	uintptr_t top = ((uintptr_t)(f->stack + STACK_BYTES) & ~(uintptr_t)15) - 16;
	uint64_t *p = (uint64_t *)top;
	*--p = (uint64_t)(uintptr_t)kvk_emu_fiber_entry; // ret
	*--p = 0;					 // rbp
	*--p = 0;					 // rbx
	*--p = (uint64_t)(uintptr_t)f;			 // r12
	*--p = 0;					 // r13
	*--p = 0;					 // r14
	*--p = 0;					 // r15
	uint32_t mxcsr;
	uint16_t fpucw;
	asm volatile("stmxcsr %0" : "=m"(mxcsr));
	asm volatile("fnstcw %0" : "=m"(fpucw));
	--p;
	memcpy((char *)p, &mxcsr, 4);
	memcpy((char *)p + 4, &fpucw, 2);
	return p;
}
#elif defined(__aarch64__)
asm(R"(
	.text
	.globl kvk_emu_switch
	.type kvk_emu_switch, %function
kvk_emu_switch:
	sub sp, sp, #176
	stp x19, x20, [sp, #0]
	stp x21, x22, [sp, #16]
	stp x23, x24, [sp, #32]
	stp x25, x26, [sp, #48]
	stp x27, x28, [sp, #64]
	stp x29, x30, [sp, #80]
	stp d8, d9, [sp, #96]
	stp d10, d11, [sp, #112]
	stp d12, d13, [sp, #128]
	stp d14, d15, [sp, #144]
	mrs x9, fpcr
	str x9, [sp, #160]
	mov x9, sp
	str x9, [x0]
	mov sp, x1
	ldr x9, [sp, #160]
	msr fpcr, x9
	ldp x19, x20, [sp, #0]
	ldp x21, x22, [sp, #16]
	ldp x23, x24, [sp, #32]
	ldp x25, x26, [sp, #48]
	ldp x27, x28, [sp, #64]
	ldp x29, x30, [sp, #80]
	ldp d8, d9, [sp, #96]
	ldp d10, d11, [sp, #112]
	ldp d12, d13, [sp, #128]
	ldp d14, d15, [sp, #144]
	add sp, sp, #176
	ret
	.size kvk_emu_switch, .-kvk_emu_switch

	.globl kvk_emu_fiber_entry
	.type kvk_emu_fiber_entry, %function
kvk_emu_fiber_entry:
	mov x0, x19
	bl kvk_emu_fiber_main
	brk #0
	.size kvk_emu_fiber_entry, .-kvk_emu_fiber_entry
	.section .note.GNU-stack,"",%progbits
	.text
)");

static void *stack_prepare(fiber *f)
{
	uintptr_t top = ((uintptr_t)(f->stack + STACK_BYTES) & ~(uintptr_t)15) - 16;
	uint64_t *p = (uint64_t *)(top - 176);
	memset(p, 0, 176);
	p[0] = (uint64_t)(uintptr_t)f;			  // x19
	p[11] = (uint64_t)(uintptr_t)kvk_emu_fiber_entry; // x30
	uint64_t fpcr;
	asm volatile("mrs %0, fpcr" : "=r"(fpcr));
	p[20] = fpcr;
	return p;
}
#else
#error "kvk_emu: context switch for x86-64 and aarch64 only"
#endif

// ---- ASan: tell it which stack runs -------------------------------------------------------------
static inline void asan_start(void **fake, const void *bottom, size_t size)
{
#ifdef EMU_ASAN
	__sanitizer_start_switch_fiber(fake, bottom, size);
#else
	(void)fake, (void)bottom, (void)size;
#endif
}

static inline void asan_finish(void *fake, const void **bottom, size_t *size)
{
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(fake, bottom, size);
#else
	(void)fake, (void)bottom, (void)size;
#endif
}

// ---- TSan: CUDA threads as fibers that synchronize only where CUDA says they do -----------------
// Switches between fibers carry no happens-before (no_sync), so two CUDA threads' accesses
// to one location are ordered only by a barrier between them (__syncthreads, __syncwarp),
// the block's start or its end: anything else is a data race in TSan's report.
static inline void tsan_switch(void *to)
{
#ifdef KVK_EMU_TSAN
	__tsan_switch_to_fiber(to, __tsan_switch_to_fiber_no_sync);
#else
	(void)to;
#endif
}

static inline void tsan_release(void *a)
{
#ifdef KVK_EMU_TSAN
	__tsan_release(a);
#else
	(void)a;
#endif
}

static inline void tsan_acquire(void *a)
{
#ifdef KVK_EMU_TSAN
	__tsan_acquire(a);
#else
	(void)a;
#endif
}

// ---- scheduler
// -------------------------------------------------------------------------------------
static void rq_push(sm *s, int i)
{
	s->runq[(s->rq_head + s->rq_len++) % s->runq.size()] = i;
}

static int rq_pop(sm *s)
{
	if (s->rng && s->rq_len > 1) { // jitter: any runnable fiber may go next
		size_t j = (s->rq_head + kvk_emu_rand(&s->rng) % s->rq_len) % s->runq.size();
		int t = s->runq[j];
		s->runq[j] = s->runq[s->rq_head];
		s->runq[s->rq_head] = t;
	}
	int i = s->runq[s->rq_head];
	s->rq_head = (s->rq_head + 1) % s->runq.size();
	s->rq_len--;
	return i;
}

// From a fiber back to the scheduler; returns when the scheduler resumes this fiber (never
// for a fiber that is done).
static void yield(sm *s, fiber *f)
{
	asan_start(f->state == F_DONE ? nullptr : &f->fake, s->sched_bottom, s->sched_size);
	tsan_switch(s->tsan_sched);
	kvk_emu_switch(&f->sp, s->sched_sp);
	asan_finish(f->fake, &s->sched_bottom, &s->sched_size);
}

static const char *op_name(int op)
{
	switch (op) {
	case KVK_EMU_SHFL_IDX:
		return "__shfl_sync";
	case KVK_EMU_SHFL_XOR:
		return "__shfl_xor_sync";
	case KVK_EMU_SHFL_DOWN:
		return "__shfl_down_sync";
	case KVK_EMU_SHFL_UP:
		return "__shfl_up_sync";
	case KVK_EMU_SYNCWARP:
		return "__syncwarp";
	case KVK_EMU_BALLOT:
		return "__ballot_sync";
	case KVK_EMU_WMMA_LOAD:
		return "wmma::load_matrix_sync";
	case KVK_EMU_WMMA_STORE:
		return "wmma::store_matrix_sync";
	case KVK_EMU_WMMA_MMA:
		return "wmma::mma_sync";
	}
	return "?";
}

// A kernel fault in the running fiber: reported once, the block abandoned, the grid stopped.
__attribute__((format(printf, 3, 4))) static void fiber_fault(sm *s, fiber *f, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	const kvk_emu_block &b = s->blk;
	fprintf(stderr,
		"kvk-emu: kernel fault in %s, block (%u,%u,%u) of (%u,%u,%u), thread (%u,%u,%u): "
		"%s\n",
		s->kname, b.idx.x, b.idx.y, b.idx.z, b.grid.x, b.grid.y, b.grid.z, f->info.tid.x,
		f->info.tid.y, f->info.tid.z, msg);
	s->fault = cudaErrorLaunchFailure;
	f->state = F_DONE;
	f->dirty = 1;
	yield(s, f);
	abort(); // a faulted fiber is never resumed
}

static void release_bar(sm *s)
{
	for (int i = 0; i < s->n; i++)
		if (s->fibers[i].state == F_BAR) {
			s->fibers[i].state = F_RUN;
			rq_push(s, i);
		}
	s->bar_arrived = 0;
	s->bar_gen++;
}

static fiber *current(const char *what)
{
	sm *s = t_sm;
	if (!s || !s->cur) {
		fprintf(stderr, "kvk-emu: %s called outside a kernel\n", what);
		abort();
	}
	return s->cur;
}

void kvk_emu_kernel_fault(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fiber_fault(t_sm, current("a device function"), "%s", msg);
	abort(); // not reached: fiber_fault does not return
}

void kvk_emu_syncthreads(void)
{
	fiber *f = current("__syncthreads");
	sm *s = t_sm;
	warp &w = s->warps[f->warp];
	if (w.arrived)
		fiber_fault(
		    s, f,
		    "__syncthreads while lanes %#x of its warp wait for it in %s (divergent "
		    "barrier)",
		    w.arrived, op_name(w.op));
	unsigned g = s->bar_gen & 1;
	tsan_release(&s->sync_bar[g]);
	if (++s->bar_arrived == s->alive) {
		release_bar(s);
	} else {
		f->state = F_BAR;
		yield(s, f);
	}
	tsan_acquire(&s->sync_bar[g]);
}

void *kvk_emu_dyn_smem(void)
{
	current("extern __shared__");
	return t_sm->blk.dyn_smem;
}

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

void *kvk_emu_static_smem(const void *site, size_t size, size_t align)
{
	fiber *f = current("__shared__");
	sm *s = t_sm;
	for (const static_var &v : s->svars)
		if (v.site == site)
			return s->sarena + v.off;
	if (!align || (align & (align - 1)) || align > 256)
		fiber_fault(s, f, "__shared__ variable with alignment %zu", align);
	size_t used = round_up(s->s_used, align) + size;
	if (size > STATIC_SMEM_MAX || used > STATIC_SMEM_MAX)
		fiber_fault(s, f,
			    "__shared__ variables of %zu bytes: a block may declare %zu bytes of "
			    "static shared memory",
			    size > STATIC_SMEM_MAX ? size : used, STATIC_SMEM_MAX);
	if (used + s->smem.size() > s->smem_limit)
		fiber_fault(
		    s, f,
		    "%zu bytes of static and %zu of dynamic shared memory: over the %zu "
		    "bytes this launch may use (cudaFuncAttributeMaxDynamicSharedMemorySize)",
		    used, s->smem.size(), s->smem_limit);
	size_t off = round_up(s->s_end, align < 16 ? 16 : align);
	if (off + size + SMEM_REDZONE > SMEM_ARENA)
		fiber_fault(s, f, "more __shared__ variables than kvk_emu has room for (%zu)",
			    s->svars.size());
#ifdef EMU_ASAN
	__asan_unpoison_memory_region(s->sarena + off, size);
#endif
	// Already 0xff (run_block): filled by the scheduler, before the block's start, so that
	// under TSan the fill is not a write of one CUDA thread racing with the others.
	s->s_used = used;
	s->s_end = off + size + SMEM_REDZONE;
	s->svars.push_back(static_var{site, off});
	return s->sarena + off;
}

uint64_t kvk_emu_warp(enum kvk_emu_warp_op op, unsigned mask, uint64_t v, int arg, int width)
{
	fiber *f = current(op_name(op));
	sm *s = t_sm;
	warp &w = s->warps[f->warp];
	unsigned bit = 1u << f->lane;
	if (width < 1 || width > 32 || (width & (width - 1)))
		fiber_fault(s, f, "%s: width %d is not a power of 2 up to 32", op_name(op), width);
	if (!(mask & bit))
		fiber_fault(s, f, "%s: lane %d calls it with mask %#x, which does not name it",
			    op_name(op), f->lane, mask);
	if (mask != w.exist)
		fiber_fault(s, f,
			    "%s: mask %#x is not the warp's lanes %#x (lanes that do not exist, or "
			    "a partial mask, which kvk_emu does not model)",
			    op_name(op), mask, w.exist);
	if (mask & w.exited)
		fiber_fault(s, f, "%s: mask %#x names lanes %#x that have exited", op_name(op),
			    mask, mask & w.exited);
	if (s->bar_arrived && f->state == F_RUN) {
		// Others wait at __syncthreads; if one of them is in this warp, this cannot meet.
		unsigned waiting = 0;
		for (int l = 0; l < 32; l++) {
			int i = f->warp * 32 + l;
			if (i < s->n && s->fibers[i].state == F_BAR)
				waiting |= 1u << l;
		}
		if (waiting & mask)
			fiber_fault(
			    s, f,
			    "%s while lanes %#x of its warp wait at __syncthreads (divergent "
			    "barrier)",
			    op_name(op), waiting & mask);
	}
	if (w.arrived) {
		if (w.op != op || w.mask != mask || w.width != width)
			fiber_fault(s, f,
				    "lanes of warp %d meet at different warp operations: %s (mask "
				    "%#x, width %d) and %s (mask %#x, width %d)",
				    f->warp, op_name(op), mask, width, op_name(w.op), w.mask,
				    w.width);
	} else {
		w.op = op;
		w.mask = mask;
		w.width = width;
	}
	unsigned g = w.gen;
	if (op == KVK_EMU_SYNCWARP)
		tsan_release(&w.sync[g & 1]);
	w.val[g & 1][f->lane] = v;
	w.arrived |= bit;
	if (w.arrived == mask) {
		for (int l = 0; l < 32; l++) {
			if (!(mask >> l & 1u) || l == f->lane)
				continue;
			fiber &o = s->fibers[f->warp * 32 + l]; // mask == exist: the lane exists
			if (o.state == F_WARP) {
				o.state = F_RUN;
				rq_push(s, f->warp * 32 + l);
			}
		}
		w.arrived = 0;
		w.gen++;
	} else {
		f->state = F_WARP;
		yield(s, f);
	}
	const uint64_t *vals = w.val[g & 1];
	int lane = f->lane, base = lane & ~(width - 1), src = lane;
	switch (op) {
	case KVK_EMU_SHFL_IDX:
		src = base + ((arg % width) + width) % width;
		break;
	case KVK_EMU_SHFL_XOR:
		src = lane ^ arg;
		if (src < 0 || src >= base + width)
			src = lane;
		break;
	case KVK_EMU_SHFL_DOWN:
		src = lane + arg;
		if (arg < 0 || src >= base + width)
			src = lane;
		break;
	case KVK_EMU_SHFL_UP:
		src = lane - arg;
		if (arg < 0 || src < base)
			src = lane;
		break;
	case KVK_EMU_SYNCWARP:
		tsan_acquire(&w.sync[g & 1]);
		return 0;
	case KVK_EMU_WMMA_LOAD: // lanes meet; no value, no memory order (mma.h)
	case KVK_EMU_WMMA_STORE:
	case KVK_EMU_WMMA_MMA:
		return 0;
	case KVK_EMU_BALLOT: {
		uint64_t r = 0;
		for (int l = 0; l < 32; l++)
			if ((mask >> l & 1u) && vals[l])
				r |= 1ull << l;
		return r;
	}
	}
	return vals[src];
}

// A fiber's whole life: the kernel body, then it leaves for good.
extern "C" void kvk_emu_fiber_main(fiber *f)
{
	sm *s = t_sm;
	asan_finish(nullptr, &s->sched_bottom, &s->sched_size);
	tsan_acquire(&s->sync_start);
	(*s->body)();
	tsan_release(&s->sync_end);
	f->state = F_DONE;
	s->alive--;
	warp &w = s->warps[f->warp];
	w.exited |= 1u << f->lane;
	if (w.arrived && (w.mask >> f->lane & 1u))
		fiber_fault(s, f, "returned while lanes %#x of its warp wait for it in %s",
			    w.arrived, op_name(w.op));
	// Threads that returned count as arrived at __syncthreads (as on the hardware).
	if (s->bar_arrived && s->bar_arrived == s->alive)
		release_bar(s);
	yield(s, f);
	abort();
}

static int fibers_ensure(sm *s, int n)
{
	while ((int)s->fibers.size() < n) {
		void *m = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
		if (m == MAP_FAILED)
			return -ENOMEM;
		if (mprotect(m, GUARD_BYTES, PROT_NONE)) {
			munmap(m, STACK_BYTES + GUARD_BYTES);
			return -ENOMEM;
		}
		s->fibers.emplace_back();
		s->fibers.back().stack = (char *)m + GUARD_BYTES;
#ifdef KVK_EMU_TSAN
		// One TSan fiber per thread slot, reused by every block: a slot's stack is too.
		// Slot i always runs the thread whose linear threadIdx is i: TSan's reports name
		// it.
		fiber &nf = s->fibers.back();
		nf.tsan = __tsan_create_fiber(0);
		snprintf(nf.tsan_name, sizeof(nf.tsan_name), "CUDA thread, linear threadIdx %zu",
			 s->fibers.size() - 1);
		__tsan_set_fiber_name(nf.tsan, nf.tsan_name);
#endif
	}
	return 0;
}

static void deadlock(sm *s)
{
	int bar = 0, done = 0;
	unsigned long long warp_waits = 0;
	int first_warp = -1;
	for (int i = 0; i < s->n; i++) {
		fiber &f = s->fibers[i];
		bar += f.state == F_BAR;
		done += f.state == F_DONE;
		if (f.state == F_WARP) {
			warp_waits++;
			if (first_warp < 0)
				first_warp = f.warp;
		}
	}
	const kvk_emu_block &b = s->blk;
	fprintf(stderr,
		"kvk-emu: kernel fault in %s, block (%u,%u,%u): barrier cannot complete: %d "
		"threads wait at __syncthreads, %llu in warp operations%s%s, %d have returned "
		"(of %d)\n",
		s->kname, b.idx.x, b.idx.y, b.idx.z, bar, warp_waits,
		first_warp >= 0 ? " (first: " : "",
		first_warp >= 0 ? op_name(s->warps[first_warp].op) : "", done, s->n);
	if (first_warp >= 0)
		fprintf(stderr, "kvk-emu:   warp %d: lanes %#x arrived of %#x\n", first_warp,
			s->warps[first_warp].arrived, s->warps[first_warp].mask);
	s->fault = cudaErrorLaunchFailure;
}

static void run_block(sm *s, uint3 idx)
{
	s->blk.idx = idx;
	if (s->blk.dyn_smem)
		memset(s->blk.dyn_smem, 0xff, s->smem.size());
		// The arena past the last block's variables is still 0xff; refill what it used.
#ifdef EMU_ASAN
	__asan_unpoison_memory_region(s->sarena, s->s_end);
#endif
	memset(s->sarena, 0xff, s->s_end);
	s->svars.clear();
	s->s_used = s->s_end = 0;
#ifdef EMU_ASAN
	__asan_poison_memory_region(s->sarena, SMEM_ARENA);
#endif
	tsan_release(&s->sync_start);
	const dim3 d = s->blk.dim;
	for (int i = 0; i < s->n; i++) {
		fiber &f = s->fibers[i];
#ifdef EMU_ASAN
		if (f.dirty)
			__asan_unpoison_memory_region(f.stack, STACK_BYTES);
#endif
		f.dirty = 0;
		f.state = F_RUN;
		f.warp = i / 32;
		f.lane = i % 32;
		f.fake = nullptr;
		f.info.tid = uint3{i % d.x, i / d.x % d.y, i / (d.x * d.y)};
		f.info.blk = &s->blk;
		f.sp = stack_prepare(&f);
	}
	for (int w = 0; w * 32 < s->n; w++) {
		warp &wp = s->warps[w];
		int lanes = s->n - w * 32 >= 32 ? 32 : s->n - w * 32;
		wp.exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
		wp.exited = wp.arrived = wp.gen = wp.mask = 0;
		wp.op = wp.width = 0;
	}
	s->alive = s->n;
	s->bar_arrived = 0;
	s->rq_head = 0;
	s->rq_len = 0;
	for (int i = 0; i < s->n; i++)
		rq_push(s, i);
	while (s->rq_len && s->fault == cudaSuccess) {
		fiber *f = &s->fibers[rq_pop(s)];
		s->cur = f;
		kvk_emu_cur = &f->info;
		asan_start(&s->sched_fake, f->stack, STACK_BYTES);
		tsan_switch(f->tsan);
		kvk_emu_switch(&s->sched_sp, f->sp);
		asan_finish(s->sched_fake, nullptr, nullptr);
		s->cur = nullptr;
		kvk_emu_cur = nullptr;
	}
	if (s->fault == cudaSuccess && s->alive > 0)
		deadlock(s);
	if (s->fault != cudaSuccess)
		for (int i = 0; i < s->n; i++) {
			fiber &f = s->fibers[i];
			if (f.state != F_DONE || f.dirty) {
				f.dirty = 1;
				// An abandoned thread's accesses end here too: release them in
				// its TSan context (the switch moves no stack, only TSan's view).
				tsan_switch(f.tsan);
				tsan_release(&s->sync_end);
				tsan_switch(s->tsan_sched);
			}
		}
	tsan_acquire(&s->sync_end);
}

static uint64_t gcd(uint64_t x, uint64_t y)
{
	while (y) {
		uint64_t t = x % y;
		x = y;
		y = t;
	}
	return x;
}

// A random number in [1, n) coprime with n (n > 1), or 1 when 64 draws found none.
static uint64_t random_coprime(uint64_t n, uint64_t *rng)
{
	for (int tries = 0; tries < 64; tries++) {
		uint64_t c = kvk_emu_rand(rng) % n;
		if (c && gcd(c, n) == 1)
			return c;
	}
	return 1;
}

cudaError_t kvk_emu_run_grid(const char *name, const kvk_emu_cfg &cfg,
			     const std::function<void()> &body, uint64_t jit, size_t smem_limit)
{
	sm *s = sm_get();
	int n = (int)(cfg.block.x * cfg.block.y * cfg.block.z);
	if (n < 1 || n > MAX_THREADS || fibers_ensure(s, n))
		return cudaErrorLaunchFailure;
	if (!s->sarena) {
		if (posix_memalign((void **)&s->sarena, 256, SMEM_ARENA))
			return cudaErrorLaunchFailure;
		memset(s->sarena, 0xff, SMEM_ARENA);
	}
#ifdef KVK_EMU_TSAN
	s->tsan_sched = __tsan_get_current_fiber();
#endif
	s->smem_limit = smem_limit;
	s->n = n;
	s->warps.resize((size_t)(n + 31) / 32);
	s->runq.resize((size_t)n + 1);
	s->smem.resize(cfg.smem);
	s->blk.dim = cfg.block;
	s->blk.grid = cfg.grid;
	s->blk.dyn_smem = cfg.smem ? s->smem.data() : nullptr;
	s->body = &body;
	s->kname = name;
	s->fault = cudaSuccess;
	t_sm = s;
	static std::atomic<uint64_t> launches{0};
	s->rng = jit ? (jit ^ (launches.fetch_add(1) * 0x9e3779b97f4a7c15ull)) | 1 : 0;
	const uint64_t gx = cfg.grid.x, gy = cfg.grid.y, total = gx * gy * cfg.grid.z;
	// Jitter: block i runs as number (a * i + b) mod total, a coprime with total: a
	// permutation, so every block still runs once.
	uint64_t a = 1, b = 0;
	if (s->rng && total > 1) {
		b = kvk_emu_rand(&s->rng) % total;
		a = random_coprime(total, &s->rng);
	}
	for (uint64_t i = 0; i < total && s->fault == cudaSuccess; i++) {
		uint64_t k = (uint64_t)(((unsigned __int128)a * i + b) % total);
		run_block(s, uint3{(unsigned)(k % gx), (unsigned)(k / gx % gy),
				   (unsigned)(k / (gx * gy))});
	}
	t_sm = nullptr;
	return s->fault;
}
