// A block's threads as fibers on one OS thread (launch.h runs each block so): a thread runs until it waits at a barrier
// (the block's, for __syncthreads(), or its warp's, for the warp-wide exchanges) or returns, then the next runnable
// one runs; a barrier's last arrival makes its waiters runnable again. A switch is a few instructions; OS threads
// would pay a futex round per thread and barrier, more than the kernels' own work on a 2-core machine, and far more
// beside other work.
//
// Sanitizers: each thread is a fiber of its own. ThreadSanitizer sees fibers as threads; the switches carry no ordering
// (__tsan_switch_to_fiber_no_sync) and a barrier orders exactly what a barrier orders on the GPU: each arrival releases
// and each departure acquires, at an address of that barrier generation's own, so that two threads of a block that
// touch one cell with no barrier between them are reported whatever order the fibers ran in. The scheduler's state
// is atomics (relaxed: it orders nothing for ThreadSanitizer). AddressSanitizer is told of each stack switch. Odd
// blocks run their threads in reverse order, so that a read that only an unordered write would satisfy differs
// between blocks even without ThreadSanitizer.
//
// A barrier that some thread never reaches leaves no thread runnable: that is reported and the process aborts.
#pragma once
#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__has_feature)  // clang's spelling of GCC's __SANITIZE_*__
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
#define __SANITIZE_THREAD__ 1
#endif
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN(...) __VA_ARGS__
#else
#define EMU_TSAN(...)
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN(...) __VA_ARGS__
#else
#define EMU_ASAN(...)
#endif

struct dim3_t { unsigned x = 0, y = 0, z = 0; };

static constexpr int    EMU_MAX_THREADS = 1024;
static constexpr size_t EMU_STACK       = 512*1024;  // per thread, with a guard page below it
static constexpr size_t EMU_GUARD       = 4096;

struct emu_fiber {
    int    id = 0;
    dim3_t tidx;            // threadIdx (launch.h sets it before the block's release)
    char * stack = nullptr;
#if defined(__x86_64__)
    void * sp = nullptr;    // the saved stack pointer (emu_switch)
#else
    ucontext_t uc;
#endif
    void * tsan = nullptr;  // ThreadSanitizer's fiber
    void * fake = nullptr;  // AddressSanitizer's fake stack across a switch
};

struct emu_barrier {
    std::atomic<int> expected{0};  // threads still taking part (a returned thread drops out, as on the GPU)
    std::atomic<int> arrived{0};
    std::atomic<int> gen{0};
    std::atomic<int> nwait{0};
    std::atomic<int> waiting[EMU_MAX_THREADS];
    char sync[2] = {0, 0};         // ThreadSanitizer's release/acquire address of each generation's parity

    void reset(const int n) {
        expected.store(n, std::memory_order_relaxed);
        arrived.store(0, std::memory_order_relaxed);
        nwait.store(0, std::memory_order_relaxed);
    }
};

static emu_fiber                g_fibers[EMU_MAX_THREADS];
static std::atomic<emu_fiber *> g_self{nullptr};            // the running thread (read by threadIdx)
static std::atomic<int>         g_ready[EMU_MAX_THREADS];   // the runnable threads, a queue (at most one entry each)
static std::atomic<int>         g_ready_head{0}, g_ready_tail{0};
static std::atomic<int>         g_ndone{0};
static void (*g_body)(void *) = nullptr;                    // what each thread runs (launch.h's block thread)
static void *  g_body_arg = nullptr;
static char    g_block_start, g_block_end;                  // ThreadSanitizer: the host before a block, a block before the host
#if defined(__x86_64__)
static void *  g_main_sp = nullptr;
#else
static ucontext_t g_main_uc;
#endif
EMU_TSAN(static void * g_main_tsan = nullptr;)
EMU_ASAN(static const void * g_main_stack = nullptr; static size_t g_main_stack_size = 0;)

static void emu_ready_push(const int id) {
    const int t = g_ready_tail.load(std::memory_order_relaxed);
    g_ready[t % EMU_MAX_THREADS].store(id, std::memory_order_relaxed);
    g_ready_tail.store(t + 1, std::memory_order_relaxed);
}

static int emu_ready_pop() {
    const int h = g_ready_head.load(std::memory_order_relaxed);
    if (h == g_ready_tail.load(std::memory_order_relaxed)) {
        return -1;
    }
    g_ready_head.store(h + 1, std::memory_order_relaxed);
    return g_ready[h % EMU_MAX_THREADS].load(std::memory_order_relaxed);
}

#if defined(__x86_64__)
// emu_switch(&save, load): the callee-saved registers pushed, the stack pointer saved to *save and loaded from load,
// the registers popped and a return on the new stack
extern "C" void emu_switch(void ** save, void * load);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");
#endif

// the host (the launch) to thread f, until f waits or returns. What the switch reads of f is read before
// ThreadSanitizer's switch: after it, an access counts as f's own.
static void emu_to_fiber(emu_fiber * f) {
    g_self.store(f, std::memory_order_relaxed);
#if defined(__x86_64__)
    void * const sp = f->sp;
#endif
    EMU_ASAN(void * fake = nullptr; __sanitizer_start_switch_fiber(&fake, f->stack, EMU_STACK);)
    EMU_TSAN(__tsan_switch_to_fiber(f->tsan, __tsan_switch_to_fiber_no_sync);)
#if defined(__x86_64__)
    emu_switch(&g_main_sp, sp);
#else
    swapcontext(&g_main_uc, &f->uc);
#endif
    EMU_ASAN(__sanitizer_finish_switch_fiber(fake, nullptr, nullptr);)
}

// thread f back to the host: it waits (resumed later where it left) or has returned (never resumed)
static void emu_to_host(emu_fiber * f, const bool returned) {
#if defined(__x86_64__)
    void * const sp = g_main_sp;
#endif
    EMU_ASAN(__sanitizer_start_switch_fiber(returned ? nullptr : &f->fake, g_main_stack, g_main_stack_size);)
    (void) returned;
    EMU_TSAN(__tsan_switch_to_fiber(g_main_tsan, __tsan_switch_to_fiber_no_sync);)
#if defined(__x86_64__)
    emu_switch(&f->sp, sp);
#else
    swapcontext(&f->uc, &g_main_uc);
#endif
    EMU_ASAN(__sanitizer_finish_switch_fiber(f->fake, nullptr, nullptr);)
}

static void emu_fiber_entry() {
    emu_fiber * f = g_self.load(std::memory_order_relaxed);
    EMU_ASAN(__sanitizer_finish_switch_fiber(nullptr, &g_main_stack, &g_main_stack_size);)
    EMU_TSAN(__tsan_acquire(&g_block_start);)
    g_body(g_body_arg);
    EMU_TSAN(__tsan_release(&g_block_end);)
    g_ndone.fetch_add(1, std::memory_order_relaxed);
    emu_to_host(f, true);
    abort();  // a returned thread is never resumed
}

// the barrier's generation complete: its waiters runnable again
static void emu_barrier_open(emu_barrier * b) {
    b->arrived.store(0, std::memory_order_relaxed);
    b->gen.fetch_add(1, std::memory_order_relaxed);
    const int n = b->nwait.exchange(0, std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
        emu_ready_push(b->waiting[i].load(std::memory_order_relaxed));
    }
}

// arrive and wait (std::barrier's arrive_and_wait)
static void emu_wait(emu_barrier * b) {
    emu_fiber * f = g_self.load(std::memory_order_relaxed);
    const int gen = b->gen.load(std::memory_order_relaxed);
    EMU_TSAN(__tsan_release(&b->sync[gen & 1]);)
    if (b->arrived.fetch_add(1, std::memory_order_relaxed) + 1 == b->expected.load(std::memory_order_relaxed)) {
        emu_barrier_open(b);
    } else {
        b->waiting[b->nwait.fetch_add(1, std::memory_order_relaxed)].store(f->id, std::memory_order_relaxed);
        emu_to_host(f, false);
    }
    EMU_TSAN(__tsan_acquire(&b->sync[gen & 1]);)
    (void) gen;
}

// a returned thread leaves the barrier (std::barrier's arrive_and_drop): its writes are ordered before the departure
// of the generation it leaves
static void emu_drop(emu_barrier * b) {
    EMU_TSAN(__tsan_release(&b->sync[b->gen.load(std::memory_order_relaxed) & 1]);)
    const int left = b->expected.fetch_sub(1, std::memory_order_relaxed) - 1;
    if (left > 0 && b->arrived.load(std::memory_order_relaxed) == left) {
        emu_barrier_open(b);
    }
}

static void emu_fiber_start(emu_fiber * f) {
    if (f->stack == nullptr) {
        void * m = mmap(nullptr, EMU_STACK + EMU_GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
        if (m == MAP_FAILED || mprotect(m, EMU_GUARD, PROT_NONE) != 0) {
            perror("emulation: a thread's stack");
            abort();
        }
        f->stack = (char *) m + EMU_GUARD;
        EMU_TSAN(f->tsan = __tsan_create_fiber(0);)
    }
    EMU_ASAN(ASAN_UNPOISON_MEMORY_REGION(f->stack, EMU_STACK);)  // frames a returned thread left behind
#if defined(__x86_64__)
    // the first switch pops six registers and returns into emu_fiber_entry, with the stack aligned as after a call
    void ** s = (void **) (((uintptr_t) (f->stack + EMU_STACK) - 16) & ~(uintptr_t) 15);
    s[1] = nullptr;
    s[0] = (void *) &emu_fiber_entry;
    f->sp = (void *) (s - 6);
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp   = f->stack;
    f->uc.uc_stack.ss_size = EMU_STACK;
    f->uc.uc_link          = nullptr;
    makecontext(&f->uc, emu_fiber_entry, 0);
#endif
}

// runs one block: threads 0..n-1 (g_fibers, their tidx set) each run body(arg), until all have returned
static void emu_run_block(const int n, const bool reverse, void (*body)(void *), void * arg) {
    if (n > EMU_MAX_THREADS) {
        fprintf(stderr, "emulation: %d threads in a block, at most %d\n", n, EMU_MAX_THREADS);
        abort();
    }
    EMU_TSAN(if (g_main_tsan == nullptr) { g_main_tsan = __tsan_get_current_fiber(); })
    g_body = body;
    g_body_arg = arg;
    g_ndone.store(0, std::memory_order_relaxed);
    g_ready_head.store(0, std::memory_order_relaxed);
    g_ready_tail.store(0, std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
        g_fibers[i].id = i;
        emu_fiber_start(&g_fibers[i]);
        emu_ready_push(reverse ? n - 1 - i : i);
    }
    EMU_TSAN(__tsan_release(&g_block_start);)
    for (int id; (id = emu_ready_pop()) >= 0;) {
        emu_to_fiber(&g_fibers[id]);
    }
    if (g_ndone.load(std::memory_order_relaxed) != n) {
        fprintf(stderr, "emulation: deadlock, %d of %d threads wait at barriers that the others never reach\n",
                n - g_ndone.load(std::memory_order_relaxed), n);
        abort();
    }
    EMU_TSAN(__tsan_acquire(&g_block_end);)
}
