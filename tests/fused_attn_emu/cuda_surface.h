// The CUDA surface that attn-decode-fused.cu's kernels use, on std::threads (tests/fused_attn_emu/harness.cpp runs
// them): thread and block indices, barriers, warp shuffles and 0040's two warp-wide matrix instructions as exchanges
// between barriers of a warp's 32 threads, f16 arithmetic rounded once to nearest even, and ggml's three block types
// with the x8 dequantizer.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

// ---- the CUDA surface the kernels use ----
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__
// programmatic dependent launch (0043): one grid at a time here, nothing to wait for
static inline void ggml_cuda_pdl_sync() {}
static inline void ggml_cuda_pdl_lc() {}

struct dim3_t { unsigned x = 0, y = 0, z = 0; };
static thread_local dim3_t threadIdx;
static thread_local dim3_t blockIdx;
static dim3_t blockDim;

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }
struct half { uint16_t bits; };

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
static inline float __half2float(half h) { return fp16_to_fp32(h.bits); }
struct half2 { half x, y; };
static inline float2 __half22float2(half2 h) { return {fp16_to_fp32(h.x.bits), fp16_to_fp32(h.y.bits)}; }

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
using std::min;
using std::max;

static std::barrier<> * g_block_bar = nullptr;
static std::barrier<> * g_warp_bar[4] = {};
static float g_xch[128];

static inline void __syncthreads() { g_block_bar->arrive_and_wait(); }

// the exchange every warp-wide instruction here is made of: each of the warp's 32 threads writes its value into
// buf [128], and after the second barrier reads the warp's 32 values (returned: the warp's first slot); the next
// exchange's first barrier keeps a thread's next write from overtaking another's read
template <typename T>
static const T * warp_exchange(T * buf, const T & v) {
    const int t = (int) threadIdx.x;
    g_warp_bar[t / 32]->arrive_and_wait();
    buf[t] = v;
    g_warp_bar[t / 32]->arrive_and_wait();
    return buf + (t - t % 32);
}

static inline float __shfl_xor_sync(unsigned, float v, int offset, int width) {
    const int lane = (int) threadIdx.x % 32;
    const int src  = (lane & ~(width - 1)) | ((lane ^ offset) & (width - 1));
    return warp_exchange(g_xch, v)[src];
}

template <int width>
static inline float warp_reduce_sum(float x) {
    for (int offset = width/2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, width);
    }
    return x;
}

template <int width>
static inline float warp_reduce_max(float x) {
    for (int offset = width/2; offset > 0; offset >>= 1) {
        x = std::fmax(x, __shfl_xor_sync(0xffffffff, x, offset, width));
    }
    return x;
}

// ---- f16 arithmetic, byte permutes and the two warp-wide matrix instructions of 0040's tensor-core V*P ----
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
static inline half mkh(const double v) { return half{fp64_to_fp16(v)}; }
static inline double hd(const half h) { return fp16_to_fp32(h.bits); }
static inline half __float2half(const float f) { return mkh(f); }
static inline half2 __float2half2_rn(const float f) { return {mkh(f), mkh(f)}; }
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
static inline void __syncwarp() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }

#define AD_EMULATE_MMA
struct mma_frag { unsigned a[4], b[2]; };
static mma_frag     g_mma[128];
static const half * g_ldsm[128];
// mma.sync m16n8k16 row.col f32.f16.f16.f32 (PTX ISA's fragments; g = lane/4, t = lane%4): A's registers hold (row g,
// k 2t..2t+1), (row g+8, the same), (row g, k 2t+8..2t+9), (row g+8, the same); B's (k 2t..2t+1, n g), (k 2t+8..,
// n g); D's (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). The products summed in double, then added to D in float.
static void ad_mma_f16(float * d, const unsigned * a, const unsigned b0, const unsigned b1) {
    const int lane = (int) threadIdx.x % 32;
    const mma_frag * w = warp_exchange(g_mma, mma_frag{{a[0], a[1], a[2], a[3]}, {b0, b1}});
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
// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane 8i + r gives row r of matrix i; lane (g, t) receives, per
// matrix, (row 2t, column g) in the low half and (row 2t + 1, column g) in the high half
static void ad_ldsm_x4_trans(unsigned * a, const half * row) {
    const int lane = (int) threadIdx.x % 32;
    const half * const * rows = warp_exchange(g_ldsm, row);
    const int g = lane / 4;
    const int t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        a[i] = (unsigned) rows[8*i + 2*t][g].bits | (unsigned) rows[8*i + 2*t + 1][g].bits << 16;
    }
}

// ---- ggml types and the x8 dequantizer (dequantize-x8.cuh, for the three types 0023 instantiates) ----
enum ggml_type { GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3, GGML_TYPE_Q8_0 = 8 };
#pragma pack(push, 1)
struct block_q4_0 { half d; uint8_t qs[16]; };
struct block_q4_1 { half2 dm; uint8_t qs[16]; };
struct block_q8_0 { half d; int8_t qs[32]; };
#pragma pack(pop)
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q8_0) == 34, "blocks");

template <ggml_type type> struct ggml_cuda_type_traits;
template <> struct ggml_cuda_type_traits<GGML_TYPE_Q4_0> { static constexpr int qr = 2; };
template <> struct ggml_cuda_type_traits<GGML_TYPE_Q4_1> { static constexpr int qr = 2; };
template <> struct ggml_cuda_type_traits<GGML_TYPE_Q8_0> { static constexpr int qr = 1; };

template <int qr>
static inline int dequantize_x8_pos(const int j, const int l) {
    if constexpr (qr == 2) {
        return (j/4)*32 + (l/4)*16 + (j%4)*4 + l%4;
    } else {
        return (j/4)*32 + (j%4)*8 + l;
    }
}

template <ggml_type type>
static inline void dequantize_x8(const char * row, const int j, float * v) {
    const int ib = j/4;
    const int is = j%4;
    if constexpr (type == GGML_TYPE_Q4_0) {
        const block_q4_0 * x = (const block_q4_0 *) row + ib;
        int q;
        std::memcpy(&q, x->qs + 4*is, 4);
        const float d = fp16_to_fp32(x->d.bits);
        for (int l = 0; l < 4; ++l) {
            v[l + 0] = d * (((q >> (8*l + 0)) & 0x0F) - 8);
            v[l + 4] = d * (((q >> (8*l + 4)) & 0x0F) - 8);
        }
    } else if constexpr (type == GGML_TYPE_Q4_1) {
        const block_q4_1 * x = (const block_q4_1 *) row + ib;
        int q;
        std::memcpy(&q, x->qs + 4*is, 4);
        const float dx = fp16_to_fp32(x->dm.x.bits), my = fp16_to_fp32(x->dm.y.bits);
        for (int l = 0; l < 4; ++l) {
            v[l + 0] = dx * ((q >> (8*l + 0)) & 0x0F) + my;
            v[l + 4] = dx * ((q >> (8*l + 4)) & 0x0F) + my;
        }
    } else {
        const block_q8_0 * x = (const block_q8_0 *) row + ib;
        const float d = fp16_to_fp32(x->d.bits);
        for (int l = 0; l < 8; ++l) {
            v[l] = d * x->qs[8*is + l];
        }
    }
}
