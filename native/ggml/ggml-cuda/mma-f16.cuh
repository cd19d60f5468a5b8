#pragma once

// llama-vq: the warp-wide tensor-core instructions of our kernels (attn-decode-vmma.cuh, attn-decode-tc.cuh,
// out-prod-q-mma.cuh), NVIDIA sm_80+. The tests' CPU emulation (tests/fused_attn_emu/cuda_surface.h) defines
// AD_EMULATE_MMA and its own ad_mma_f16, ad_mma_s8 and ad_ldsm_x4_trans, as the PTX ISA defines them.

#include "common.cuh"

#if defined(AMPERE_MMA_AVAILABLE) && !defined(AD_EMULATE_MMA)
// D += A B, m16n8k16, A row-major 16x16 f16 (4 registers), B column-major 16x8 f16 (2), D 16x8 f32 (PTX ISA's fragments)
static __device__ __forceinline__ void ad_mma_f16(float * d, const unsigned * a, const unsigned b0, const unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A B, m16n8k32, A row-major 16x32 s8 (4 registers of 4 bytes), B column-major 32x8 s8 (2), D 16x8 s32
static __device__ __forceinline__ void ad_mma_s8(int * d, const unsigned * a, const unsigned b0, const unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// four 8x8 f16 matrices, transposed: lane 8i + r gives the address of row r of matrix i (16 bytes, 16-byte aligned)
static __device__ __forceinline__ void ad_ldsm_x4_trans(unsigned * a, const half * row) {
    const unsigned s = (unsigned) __cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(s));
}
#endif // defined(AMPERE_MMA_AVAILABLE) && !defined(AD_EMULATE_MMA)
