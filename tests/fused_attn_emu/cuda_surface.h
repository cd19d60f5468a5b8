// The CUDA and HIP surface our kernels use, on fibers (fibers.h; launch.h runs them): thread and block indices, barriers,
// warp shuffles, ballots and the tensor-core V*P's two warp-wide matrix instructions as exchanges between barriers of a warp's lanes,
// f16 arithmetic rounded once to nearest even, and ggml's block types (ggml.h and ggml-common.h of the exported tree).
//
// Two surfaces, chosen at compile time (a kernel's warp size is a constant expression, as on the GPU):
//   CUDA (default):        32-lane warps; __syncwarp() a barrier of the warp; 32-bit ballots; H200 shared memory
//   HIP (-DGGML_USE_HIP):  gfx90a as a ggml HIP build compiles it (__GFX9__): 64-lane wavefronts; the *_sync shuffles
//                          mapped to __shfl_xor/__shfl (their mask ignored) as ggml's vendors/hip.h does; 64-bit
//                          __ballot/__activemask; ggml_cuda_syncwarp() a no-op and __syncwarp() absent (ggml defines
//                          HIP_DISABLE_WARP_SYNC_BUILTINS); 64 KiB of LDS per workgroup
// ggml's own definitions (WARP_SIZE 32 on every backend, ggml_cuda_get_physical_warp_size(), the warp reductions with
// a default width of WARP_SIZE, ggml_cuda_syncwarp) are restated from common.cuh below as they read there.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

#include "fibers.h"

#if defined(GGML_USE_HIP)
#define __GFX9__        // gfx90a
#define GGML_COMMON_DECL_HIP
#define GGML_COMMON_IMPL_HIP
#else
#define GGML_COMMON_DECL_CUDA
#define GGML_COMMON_IMPL_CUDA
#endif

// ---- the language surface ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define NO_DEVICE_CODE do { fprintf(stderr, "NO_DEVICE_CODE reached\n"); abort(); } while (0)
#define GGML_UNUSED(x) (void) (x)
// programmatic dependent launch: one grid at a time here, nothing to wait for
static inline void ggml_cuda_pdl_sync() {}
static inline void ggml_cuda_pdl_lc() {}

// threadIdx: the running thread's (fibers.h); blockIdx: the block's, set by the launch before its threads run
#define threadIdx (g_self.load(std::memory_order_relaxed)->tidx)
static dim3_t blockIdx;
static dim3_t blockDim;
static dim3_t gridDim;

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }

static float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h >> 15) << 31;
    const int      exp  = (h >> 10) & 0x1F;
    const uint32_t man  = h & 0x3FF;
    float f;
    if (exp == 0) {
        f = std::ldexp((float) man, -24);
    } else if (exp == 31) {
        f = man ? NAN : INFINITY;
    } else {
        f = std::ldexp((float) (man | 0x400), exp - 25);
    }
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
}
// a double rounded to the nearest f16 (ties to even; subnormals; inf past the largest finite value)
static uint16_t fp64_to_fp16(const double v) {
    if (std::isnan(v)) {
        return 0x7E00;
    }
    const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double a = std::fabs(v);
    if (a == 0.0) {
        return sign;
    }
    int e;
    std::frexp(a, &e);                       // a = f * 2^e, f in [0.5, 1)
    const int q = std::max(e - 11, -24);     // the f16 quantum at a's binade (subnormals: 2^-24)
    const double r = std::ldexp(std::nearbyint(std::ldexp(a, -q)), q); // nearbyint: ties to even
    if (r > 65504.0) {
        return sign | 0x7C00;
    }
    if (r < std::ldexp(1.0, -14)) {
        return sign | (uint16_t) std::ldexp(r, 24);
    }
    int e2;
    const double f = std::frexp(r, &e2);
    return sign | (uint16_t) ((e2 - 1 + 15) << 10) | (uint16_t) std::ldexp(2.0*f - 1.0, 10);
}
// half converts from and to float implicitly as CUDA's and HIP's do (rounded to nearest even)
struct half {
    uint16_t bits;
    half() = default;
    half(const float f) : bits(fp64_to_fp16(f)) {}
    operator float() const { return fp16_to_fp32(bits); }
    static half raw(const uint16_t b) { half h; h.bits = b; return h; }
};
struct half2 { half x, y; };
static inline float __half2float(half h) { return fp16_to_fp32(h.bits); }
static inline float2 __half22float2(half2 h) { return {fp16_to_fp32(h.x.bits), fp16_to_fp32(h.y.bits)}; }
static inline float __int_as_float(const int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(const float f) { int i; std::memcpy(&i, &f, 4); return i; }

template <typename dst_t, typename src_t>
static inline dst_t ggml_cuda_cast(src_t x) {
    if constexpr (std::is_same_v<dst_t, src_t>) {
        return x;
    } else {
        return dst_t(float(x));
    }
}

// dp4a: c + the dot product of a's and b's four signed bytes
static inline int ggml_cuda_dp4a(const int a, const int b, int c) {
    for (int l = 0; l < 4; ++l) {
        c += (int) (int8_t) (a >> (8*l)) * (int) (int8_t) (b >> (8*l));
    }
    return c;
}

// ggml_cuda_memcpy_1<nbytes, alignment>: a copy (alignment as ggml's: the size of each access)
template <int nbytes, int alignment = 0>
static inline void ggml_cuda_memcpy_1(void * dst, const void * src) {
    static_assert(alignment == 0 || nbytes % alignment == 0, "bad alignment");
    std::memcpy(dst, src, nbytes);
}
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// the device min/max overloads (mixed-width integers promote as in C)
static inline int min(const int a, const int b) { return a < b ? a : b; }
static inline int max(const int a, const int b) { return a > b ? a : b; }
static inline unsigned min(const unsigned a, const unsigned b) { return a < b ? a : b; }
static inline unsigned max(const unsigned a, const unsigned b) { return a > b ? a : b; }
static inline long long min(const long long a, const long long b) { return a < b ? a : b; }
static inline long long max(const long long a, const long long b) { return a > b ? a : b; }
static inline long min(const long a, const long b) { return a < b ? a : b; }
static inline long max(const long a, const long b) { return a > b ? a : b; }
static inline float min(const float a, const float b) { return std::fmin(a, b); }
static inline float max(const float a, const float b) { return std::fmax(a, b); }

// ---- ggml's types and block layouts, from the exported tree (-I ggml/include -I ggml/src; the f16 headers that
// ggml-common.h includes are empty stand-ins in include/, the types being the ones above) ----
#include "ggml.h"
#include "ggml-common.h"

template <ggml_type type> struct ggml_cuda_type_traits;
#define EMU_TRAITS(T, QK, QR, BLOCK) \
    template <> struct ggml_cuda_type_traits<T> { static constexpr int qk = QK; static constexpr int qr = QR; \
        static constexpr int bs = sizeof(BLOCK); }
EMU_TRAITS(GGML_TYPE_Q4_0,   QK4_0,  QR4_0,  block_q4_0);
EMU_TRAITS(GGML_TYPE_Q4_1,   QK4_1,  QR4_1,  block_q4_1);
EMU_TRAITS(GGML_TYPE_Q5_0,   QK5_0,  QR5_0,  block_q5_0);
EMU_TRAITS(GGML_TYPE_Q5_1,   QK5_1,  QR5_1,  block_q5_1);
EMU_TRAITS(GGML_TYPE_Q8_0,   QK8_0,  QR8_0,  block_q8_0);
EMU_TRAITS(GGML_TYPE_IQ4_NL, QK4_NL, QR4_NL, block_iq4_nl);
#undef EMU_TRAITS

// ---- the warp: WARP_SIZE and the physical warp size as common.cuh defines them ----
#define WARP_SIZE 32
static constexpr int ggml_cuda_get_physical_warp_size() {
#if defined(GGML_USE_HIP) && (defined(__GFX9__) || defined(__GFX8__))
    return 64;
#else
    return 32;
#endif // defined(GGML_USE_HIP) && (defined(__GFX9__) || defined(__GFX8__))
}
static constexpr int EMU_WARP = ggml_cuda_get_physical_warp_size();
#if defined(GGML_USE_HIP)
static constexpr size_t EMU_LDS_LIMIT     = 65536;  // gfx90a: 64 KiB of LDS per workgroup, static and dynamic
static constexpr size_t EMU_STATIC_LIMIT  = 65536;
#else
static constexpr size_t EMU_LDS_LIMIT     = 232448; // H200: 227 KiB per block with the opt-in ggml sets
static constexpr size_t EMU_STATIC_LIMIT  = 49152;  // 48 KiB of static shared memory
#endif

static emu_barrier *  g_block_bar = nullptr;
static emu_barrier ** g_warp_bar  = nullptr; // [threads/EMU_WARP] (launch.h)
static inline int emu_tid() { return (int) (threadIdx.x + blockDim.x*(threadIdx.y + blockDim.y*threadIdx.z)); }
static inline int emu_lane() { return emu_tid() % EMU_WARP; }

static inline void __syncthreads() { emu_wait(g_block_bar); }

// the exchange every warp-wide instruction here is made of: each lane writes its value into the warp's slots, and
// after the second barrier reads the warp's values (returned: the warp's first slot); the next exchange's first
// barrier keeps a lane's next write from overtaking another's read. A lane that never reaches it deadlocks the warp.
template <typename T>
static const T * warp_exchange(const T & v) {
    static T buf[1024];
    const int t = emu_tid();
    emu_wait(g_warp_bar[t / EMU_WARP]);
    buf[t] = v;
    emu_wait(g_warp_bar[t / EMU_WARP]);
    return buf + (t - t % EMU_WARP);
}

#if defined(GGML_USE_HIP)
// HIP's: a source lane outside the caller's width-segment returns the caller's own value
template <typename T>
static inline T __shfl_xor(T var, int lane_mask, int width = EMU_WARP) {
    const int self = emu_lane();
    int src = self ^ lane_mask;
    src = src >= ((self + width) & ~(width - 1)) ? self : src;
    return warp_exchange(var)[src];
}
template <typename T>
static inline T __shfl(T var, int src_lane, int width = EMU_WARP) {
    const int self = emu_lane();
    return warp_exchange(var)[(src_lane & (width - 1)) + (self & ~(width - 1))];
}
template <typename T>
static inline T __shfl_up(T var, unsigned delta, int width = EMU_WARP) {
    const int self = emu_lane();
    const int src  = (self & (width - 1)) - (int) delta < 0 ? self : self - (int) delta;
    return warp_exchange(var)[src];
}
// 64-bit masks, bit i = lane i of the wavefront
static inline uint64_t __ballot(int pred) {
    const int * p = warp_exchange(pred);
    uint64_t m = 0;
    for (int i = 0; i < EMU_WARP; ++i) {
        m |= (uint64_t) (p[i] != 0) << i;
    }
    return m;
}
static inline uint64_t __activemask() { return __ballot(1); }
static inline int __all(int pred) { return __ballot(pred) == ~(uint64_t) 0; }
static inline int __any(int pred) { return __ballot(pred) != 0; }
// vendors/hip.h
#define __shfl_sync(mask, var, laneMask, width) __shfl(var, laneMask, width)
#define __shfl_up_sync(mask, var, laneMask, width) __shfl_up(var, laneMask, width)
#define __shfl_xor_sync(mask, var, laneMask, width) __shfl_xor(var, laneMask, width)
#define __all_sync(mask, var) __all(var)
#define __any_sync(mask, var) __any(var)
#else
// CUDA's: mask names the participating lanes (all of them in our kernels: every lane reaches every shuffle)
template <typename T>
static inline T __shfl_xor_sync(unsigned, T var, int lane_mask, int width = EMU_WARP) {
    const int lane = emu_lane();
    const int src  = (lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1));
    return warp_exchange(var)[src];
}
template <typename T>
static inline T __shfl_sync(unsigned, T var, int src_lane, int width = EMU_WARP) {
    return warp_exchange(var)[(emu_lane() & ~(width - 1)) + (src_lane & (width - 1))];
}
template <typename T>
static inline T __shfl_up_sync(unsigned, T var, unsigned delta, int width = EMU_WARP) {
    const int self = emu_lane();
    const int src  = (self & (width - 1)) - (int) delta < 0 ? self : self - (int) delta;
    return warp_exchange(var)[src];
}
static inline unsigned __ballot_sync(unsigned, int pred) {
    const int * p = warp_exchange(pred);
    unsigned m = 0;
    for (int i = 0; i < EMU_WARP; ++i) {
        m |= (unsigned) (p[i] != 0) << i;
    }
    return m;
}
static inline unsigned __activemask() { return __ballot_sync(0xFFFFFFFF, 1); }
static inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, pred) == 0xFFFFFFFF; }
static inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
static inline void __syncwarp() { emu_wait(g_warp_bar[emu_tid() / EMU_WARP]); }
#endif // defined(GGML_USE_HIP)

// common.cuh
static inline void ggml_cuda_syncwarp() {
#ifndef GGML_USE_HIP
    __syncwarp();
#endif // GGML_USE_HIP
}

template <int width = WARP_SIZE>
static inline float warp_reduce_sum(float x) {
    for (int offset = width/2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, width);
    }
    return x;
}

template <int width = WARP_SIZE>
static inline int warp_reduce_sum(int x) {
    for (int offset = width/2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, width);
    }
    return x;
}

template <int width = WARP_SIZE>
static inline float warp_reduce_max(float x) {
    for (int offset = width/2; offset > 0; offset >>= 1) {
        x = std::fmax(x, __shfl_xor_sync(0xffffffff, x, offset, width));
    }
    return x;
}

// ---- device memory seen by every block: the atomics, fences and L1-bypassing loads the folded combine uses ----
// (atomics with acquire-release order: what a block wrote before its __threadfence() and count is seen by the block
// whose count comes after it, as the GPU's memory model gives it, and as ThreadSanitizer can check it)
static inline unsigned atomicInc(unsigned * address, const unsigned val) {
    unsigned old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(address, &old, old >= val ? 0u : old + 1u, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T>
static inline T __ldcg(const T * ptr) { return *ptr; }

// ---- shared memory: the launch's dynamic buffer, and each block's instances of the static arrays ----
static int64_t * g_smem = nullptr;       // the launch's dynamic shared memory (launch.h)
static size_t    g_smem_dynamic = 0;
static std::mutex g_static_smem_mu;
static std::map<const void *, std::unique_ptr<int64_t[]>> g_static_smem; // emptied before each block
static size_t    g_static_smem_bytes = 0;

// `__shared__ T x[A][B];` in a kernel becomes a reference to this (tests/support/kernel_sources.py for_emulation): the block's
// instance, filled with NaN bytes, allocated by the first thread that reaches the declaration
template <typename T>
static T & emu_static_shared(const void * key) {
    std::lock_guard<std::mutex> lock(g_static_smem_mu);
    auto & slot = g_static_smem[key];
    if (!slot) {
        slot.reset(new int64_t[(sizeof(T) + 7)/8]);
        std::memset(slot.get(), 0xFF, (sizeof(T) + 7)/8*8);
        g_static_smem_bytes += sizeof(T);
        if (g_static_smem_bytes > EMU_STATIC_LIMIT || g_static_smem_bytes + g_smem_dynamic > EMU_LDS_LIMIT) {
            fprintf(stderr, "shared memory over the limit: %zu static + %zu dynamic bytes\n", g_static_smem_bytes,
                    g_smem_dynamic);
            abort();
        }
    }
    return *(T *) slot.get();
}
// one key per declaration and template instance
#define EMU_SHARED_KEY ([] { static const char k = 0; return (const void *) &k; }())

// ---- f16 arithmetic, byte permutes and the two warp-wide matrix instructions of the tensor-core V*P ----
static inline half mkh(const double v) { return half::raw(fp64_to_fp16(v)); }
static inline double hd(const half h) { return fp16_to_fp32(h.bits); }
static inline half __float2half(const float f) { return mkh(f); }
static inline half2 __float2half2_rn(const float f) { return {mkh(f), mkh(f)}; }
static inline half2 __floats2half2_rn(const float a, const float b) { return {mkh(a), mkh(b)}; }
static inline half2 __half2half2(const half h) { return {h, h}; }
static inline half2 __low2half2(const half2 h) { return {h.x, h.x}; }
static inline half2 __high2half2(const half2 h) { return {h.y, h.y}; }
// one rounding per result, as the f16 units: the exact value (a double holds these products and sums) rounded
static inline half2 __hsub2(const half2 a, const half2 b) { return {mkh(hd(a.x) - hd(b.x)), mkh(hd(a.y) - hd(b.y))}; }
static inline half2 __hmul2(const half2 a, const half2 b) { return {mkh(hd(a.x)*hd(b.x)), mkh(hd(a.y)*hd(b.y))}; }
static inline half2 __hfma2(const half2 a, const half2 b, const half2 c) {
    return {mkh(hd(a.x)*hd(b.x) + hd(c.x)), mkh(hd(a.y)*hd(b.y) + hd(c.y))};
}
// result byte i = byte (s >> 4i) & 7 of the 8 bytes y:x
static inline unsigned __byte_perm(const unsigned x, const unsigned y, const unsigned s) {
    const uint64_t xy = (uint64_t) y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) {
        r |= (unsigned) ((xy >> (8*((s >> (4*i)) & 7))) & 0xFF) << (8*i);
    }
    return r;
}

#if !defined(GGML_USE_HIP)
#define AD_EMULATE_MMA
struct mma_frag { unsigned a[4], b[2]; };
// mma.sync m16n8k16 row.col f32.f16.f16.f32 (PTX ISA's fragments; g = lane/4, t = lane%4): A's registers hold (row g,
// k 2t..2t+1), (row g+8, the same), (row g, k 2t+8..2t+9), (row g+8, the same); B's (k 2t..2t+1, n g), (k 2t+8..,
// n g); D's (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). The products summed in double, then added to D in float.
static void ad_mma_f16(float * d, const unsigned * a, const unsigned b0, const unsigned b1) {
    const int lane = emu_lane();
    const mma_frag * w = warp_exchange(mma_frag{{a[0], a[1], a[2], a[3]}, {b0, b1}});
    auto h16 = [](const unsigned r, const int k) { return (double) fp16_to_fp32((uint16_t) (k % 2 ? r >> 16 : r & 0xFFFF)); };
    auto A = [&](const int m, const int k) { return h16(w[(m % 8)*4 + (k % 8)/2].a[(m >= 8) + 2*(k >= 8)], k); };
    auto B = [&](const int k, const int n) { return h16(w[n*4 + (k % 8)/2].b[k >= 8], k); };
    const int g = lane / 4;
    const int t = lane % 4;
    for (int e = 0; e < 4; ++e) {
        const int m = g + 8*(e >> 1);
        const int n = 2*t + (e & 1);
        double acc = 0.0;
        for (int k = 0; k < 16; ++k) {
            acc += A(m, k)*B(k, n);
        }
        d[e] = (float) (d[e] + acc);
    }
}
// mma.sync m16n8k32 row.col s32.s8.s8.s32 (PTX ISA's fragments; g = lane/4, t = lane%4): A's registers hold 4 bytes
// each, (row g, k 4t..4t+3), (row g+8, the same), (row g, k 16+4t..), (row g+8, the same); B's (k 4t..4t+3, n g),
// (k 16+4t.., n g); D's (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). Exact integer sums.
static void ad_mma_s8(int * d, const unsigned * a, const unsigned b0, const unsigned b1) {
    const int lane = emu_lane();
    const mma_frag * w = warp_exchange(mma_frag{{a[0], a[1], a[2], a[3]}, {b0, b1}});
    auto s8 = [](const unsigned r, const int k) { return (int) (int8_t) (uint8_t) (r >> (8*(k % 4))); };
    auto A = [&](const int m, const int k) { return s8(w[(m % 8)*4 + (k % 16)/4].a[(m >= 8) + 2*(k >= 16)], k); };
    auto B = [&](const int k, const int n) { return s8(w[n*4 + (k % 16)/4].b[k >= 16], k); };
    const int g = lane / 4;
    const int t = lane % 4;
    for (int e = 0; e < 4; ++e) {
        const int m = g + 8*(e >> 1);
        const int n = 2*t + (e & 1);
        int acc = 0;
        for (int k = 0; k < 32; ++k) {
            acc += A(m, k)*B(k, n);
        }
        d[e] += acc;
    }
}
// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane 8i + r gives row r of matrix i; lane (g, t) receives, per
// matrix, (row 2t, column g) in the low half and (row 2t + 1, column g) in the high half
static void ad_ldsm_x4_trans(unsigned * a, const half * row) {
    const int lane = emu_lane();
    const half * const * rows = warp_exchange(row);
    const int g = lane / 4;
    const int t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        a[i] = (unsigned) rows[8*i + 2*t][g].bits | (unsigned) rows[8*i + 2*t + 1][g].bits << 16;
    }
}
#endif // !defined(GGML_USE_HIP)

#if defined(AD_EMULATE_CP_ASYNC)
// ---- cp.async (NVIDIA sm_80+), for the fused attention's two-buffer tile pipeline (harness.cpp defines CP_ASYNC_AVAILABLE
// and AD_EMULATE_CP_ASYNC on the CUDA surface): a thread's copies wait in its own queue, each in the group that its next
// commit closes, and land (are copied, by that thread) only when a wait covers them: wait_group N lands every copy but
// those of the newest N committed groups and of the open one, wait_all every copy. So a kernel that reads a tile before
// waiting for it reads the NaN the block's shared memory starts as (or an earlier tile), and under ThreadSanitizer a
// read that no barrier orders after the landing thread's wait is a race. A GPU may land a copy sooner, never later.
// Copies left in a queue when its block ends are dropped and counted (g_cp_unwaited: launch.h; the harness fails the
// case). ----
struct emu_cp_copy {
    size_t       dst; // bytes into the launch's dynamic shared memory
    const char * src;
    int          n;
    int          group;
};
static std::vector<emu_cp_copy> g_cp_queue[EMU_MAX_THREADS];
static int                      g_cp_group[EMU_MAX_THREADS]; // the open group's number (committed: all below)
static size_t                   g_cp_unwaited = 0;           // copies issued and never waited for, all blocks so far

// the kernels stage into the dynamic shared memory only: its offsets are the shared addresses
static inline unsigned int ggml_cuda_cvta_generic_to_shared(const void * p) {
    const ptrdiff_t off = (const char *) p - (const char *) g_smem;
    if (off < 0 || (size_t) off >= g_smem_dynamic) {
        fprintf(stderr, "cp.async: a destination outside the dynamic shared memory\n");
        abort();
    }
    return (unsigned int) off;
}

// land the calling thread's copies of the groups below `below`
static inline void emu_cp_land(const int below) {
    auto & q = g_cp_queue[emu_tid()];
    size_t kept = 0;
    for (size_t i = 0; i < q.size(); ++i) {
        if (q[i].group < below) {
            std::memcpy((char *) g_smem + q[i].dst, q[i].src, (size_t) q[i].n);
        } else {
            q[kept++] = q[i];
        }
    }
    q.resize(kept);
}

template <int UNIT>
static inline void ad_cp_async(const unsigned int dst, const char * src) {
    static_assert(UNIT == 16 || UNIT == 8 || UNIT == 4, "cp.async copies 16, 8 or 4 bytes");
    if ((uintptr_t) src % UNIT != 0 || dst % UNIT != 0 || dst + UNIT > g_smem_dynamic) {
        fprintf(stderr, "cp.async: a %d-byte copy misaligned or past the shared memory (%u)\n", UNIT, dst);
        abort();
    }
    const int t = emu_tid();
    g_cp_queue[t].push_back({dst, src, UNIT, g_cp_group[t]});
}

static inline void ad_cp_commit() {
    ++g_cp_group[emu_tid()];
}

template <int N>
static inline void ad_cp_wait() {
    emu_cp_land(g_cp_group[emu_tid()] - N);
}

static inline void ad_cp_wait_all() {
    emu_cp_land(INT32_MAX);
}

// a block's fresh queues (launch.h)
static inline void emu_cp_reset(const int nthreads) {
    for (int t = 0; t < nthreads; ++t) {
        g_cp_queue[t].clear();
        g_cp_group[t] = 0;
    }
}

// the copies the block's threads issued and never waited for, counted into g_cp_unwaited and dropped (launch.h, when
// the block's threads have returned)
static inline void emu_cp_drop_unwaited(const int nthreads) {
    for (int t = 0; t < nthreads; ++t) {
        g_cp_unwaited += g_cp_queue[t].size();
        g_cp_queue[t].clear();
    }
}
#endif // defined(AD_EMULATE_CP_ASYNC)
