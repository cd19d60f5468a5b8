#pragma once

#include "common.cuh"
#include "convert.cuh"

// Dequantization of 8 values of a row of 32-value blocks (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl) per call:
// slot j (0 .. ne00/8 - 1) is a quarter of block j/4, read with 4-byte (q8_0: 8-byte) loads.

// position of value l (0..7) of slot j (8 values) within a row:
//   qr == 2: slot j covers bytes 4*(j%4)..4*(j%4)+3 of block j/4, low nibbles first, then the high ones
//   qr == 1: slot j covers bytes 8*(j%4)..8*(j%4)+7 of block j/4
template <int qr>
static __device__ __forceinline__ int dequantize_x8_pos(const int j, const int l) {
    if constexpr (qr == 2) {
        return (j/4)*32 + (l/4)*16 + (j%4)*4 + l%4;
    } else {
        return (j/4)*32 + (j%4)*8 + l;
    }
}

// byte l (0..3) of x as a float, without an integer-to-float conversion instruction (I2F runs at 1/8 of the FMA rate
// on sm_80/sm_90 and was the bound of the kernels that dequantize with this header): the byte becomes the low mantissa
// bits of 2^23 (0x4B000000), and 2^23 is subtracted; exact for 0..255, so the values are the same bits as before
static __device__ __forceinline__ float dequantize_x8_byte_f32(const int x, const int l) {
    const int w = __byte_perm(x, 0x4B000000, 0x7540 | l);
    return __int_as_float(w) - 8388608.0f;
}

// the same minus 8 (q4_0's offset) in one subtraction: 2^23 + b - (2^23 + 8) is exact in f32, so the float is the
// one dequantize_x8_byte_f32(x, l) - 8.0f gives
static __device__ __forceinline__ float dequantize_x8_byte_f32_m8(const int x, const int l) {
    const int w = __byte_perm(x, 0x4B000000, 0x7540 | l);
    return __int_as_float(w) - 8388616.0f;
}

template <ggml_type type>
static __device__ __forceinline__ void dequantize_x8(const char * __restrict__ row, const int j, float * __restrict__ v) {
    const int ib = j/4;
    const int is = j%4;

    if constexpr (type == GGML_TYPE_Q4_0) {
        const block_q4_0 * x = (const block_q4_0 *) row + ib;
        int q;
        ggml_cuda_memcpy_1<4, 2>(&q, x->qs + 4*is);
        const float d = __half2float(x->d);
        const int lo = q & 0x0F0F0F0F;
        const int hi = (q >> 4) & 0x0F0F0F0F;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            v[l + 0] = d * dequantize_x8_byte_f32_m8(lo, l);
            v[l + 4] = d * dequantize_x8_byte_f32_m8(hi, l);
        }
    } else if constexpr (type == GGML_TYPE_Q4_1) {
        const block_q4_1 * x = (const block_q4_1 *) row + ib;
        int q;
        ggml_cuda_memcpy_1<4>(&q, x->qs + 4*is);
        const float2 dm = __half22float2(x->dm);
        const int lo = q & 0x0F0F0F0F;
        const int hi = (q >> 4) & 0x0F0F0F0F;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            v[l + 0] = dm.x * dequantize_x8_byte_f32(lo, l) + dm.y;
            v[l + 4] = dm.x * dequantize_x8_byte_f32(hi, l) + dm.y;
        }
    } else if constexpr (type == GGML_TYPE_Q5_0) {
        const block_q5_0 * x = (const block_q5_0 *) row + ib;
        int q;
        int qh;
        ggml_cuda_memcpy_1<4, 2>(&q,  x->qs + 4*is);
        ggml_cuda_memcpy_1<4, 2>(&qh, x->qh);
        const float d = __half2float(x->d);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int h0 = ((qh >> (4*is + l +  0)) << 4) & 0x10;
            const int h1 = ((qh >> (4*is + l + 16)) << 4) & 0x10;
            v[l + 0] = d * ((((q >> (8*l + 0)) & 0x0F) | h0) - 16);
            v[l + 4] = d * ((((q >> (8*l + 4)) & 0x0F) | h1) - 16);
        }
    } else if constexpr (type == GGML_TYPE_Q5_1) {
        const block_q5_1 * x = (const block_q5_1 *) row + ib;
        int q;
        int qh;
        ggml_cuda_memcpy_1<4>(&q,  x->qs + 4*is);
        ggml_cuda_memcpy_1<4>(&qh, x->qh);
        const float2 dm = __half22float2(x->dm);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int h0 = ((qh >> (4*is + l +  0)) << 4) & 0x10;
            const int h1 = ((qh >> (4*is + l + 16)) << 4) & 0x10;
            v[l + 0] = dm.x * (((q >> (8*l + 0)) & 0x0F) | h0) + dm.y;
            v[l + 4] = dm.x * (((q >> (8*l + 4)) & 0x0F) | h1) + dm.y;
        }
    } else if constexpr (type == GGML_TYPE_Q8_0) {
        const block_q8_0 * x = (const block_q8_0 *) row + ib;
        int q[2];
        ggml_cuda_memcpy_1<8, 2>(q, x->qs + 8*is);
        const float d = __half2float(x->d);
        // bytes + 128 (0 .. 255), converted, minus 128: the int8 values exactly
        const int u0 = q[0] ^ 0x80808080;
        const int u1 = q[1] ^ 0x80808080;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            v[l + 0] = d * (dequantize_x8_byte_f32(u0, l) - 128.0f);
            v[l + 4] = d * (dequantize_x8_byte_f32(u1, l) - 128.0f);
        }
    } else if constexpr (type == GGML_TYPE_IQ4_NL) {
        const block_iq4_nl * x = (const block_iq4_nl *) row + ib;
        int q;
        ggml_cuda_memcpy_1<4, 2>(&q, x->qs + 4*is);
        const float d = __half2float(x->d);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            v[l + 0] = d * kvalues_iq4nl[(q >> (8*l + 0)) & 0x0F];
            v[l + 4] = d * kvalues_iq4nl[(q >> (8*l + 4)) & 0x0F];
        }
    } else {
        static_assert(type == GGML_TYPE_COUNT, "unsupported type");
    }
}

// rows of a (possibly permuted) quantized tensor -> T (half or float), contiguous [ne00, ne01, ne02, ne03]
template <ggml_type type, typename T>
static __global__ void dequantize_x8_rows(
        const char * __restrict__ x, T * __restrict__ y, const int ne00, const int ne01, const int ne02, const int ne03,
        const int64_t nb01, const int64_t nb02, const int64_t nb03) {
    constexpr int qr = ggml_cuda_type_traits<type>::qr;

    const int tpr = ne00/8;
    const int i   = blockIdx.x*blockDim.x + threadIdx.x;
    if (i >= ne01*tpr) {
        return;
    }
    const int i01 = i/tpr;
    const int j   = i - i01*tpr;

    for (int i03 = blockIdx.z; i03 < ne03; i03 += gridDim.z) {
        for (int i02 = blockIdx.y; i02 < ne02; i02 += gridDim.y) {
            float v[8];
            dequantize_x8<type>(x + i01*nb01 + i02*nb02 + i03*nb03, j, v);

            T * dst = y + ((int64_t) (i03*ne02 + i02)*ne01 + i01)*ne00;
#pragma unroll
            for (int l = 0; l < 8; ++l) {
                dst[dequantize_x8_pos<qr>(j, l)] = ggml_cuda_cast<T>(v[l]);
            }
        }
    }
}

template <typename T>
static void dequantize_x8_rows_cuda(
        const ggml_type type, const void * x, T * y, const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t ne03,
        const int64_t nb01, const int64_t nb02, const int64_t nb03, cudaStream_t stream) {
    GGML_ASSERT(ne00 % 32 == 0 && ne01*(ne00/8) <= INT_MAX);
    const dim3 grid((ne01*(ne00/8) + 255)/256, std::min<int64_t>(ne02, 65535), std::min<int64_t>(ne03, 65535));
    const char * xc = (const char *) x;
    switch (type) {
        case GGML_TYPE_Q4_0:   dequantize_x8_rows<GGML_TYPE_Q4_0,   T><<<grid, 256, 0, stream>>>(xc, y, ne00, ne01, ne02, ne03, nb01, nb02, nb03); break;
        case GGML_TYPE_Q4_1:   dequantize_x8_rows<GGML_TYPE_Q4_1,   T><<<grid, 256, 0, stream>>>(xc, y, ne00, ne01, ne02, ne03, nb01, nb02, nb03); break;
        case GGML_TYPE_Q5_0:   dequantize_x8_rows<GGML_TYPE_Q5_0,   T><<<grid, 256, 0, stream>>>(xc, y, ne00, ne01, ne02, ne03, nb01, nb02, nb03); break;
        case GGML_TYPE_Q5_1:   dequantize_x8_rows<GGML_TYPE_Q5_1,   T><<<grid, 256, 0, stream>>>(xc, y, ne00, ne01, ne02, ne03, nb01, nb02, nb03); break;
        case GGML_TYPE_Q8_0:   dequantize_x8_rows<GGML_TYPE_Q8_0,   T><<<grid, 256, 0, stream>>>(xc, y, ne00, ne01, ne02, ne03, nb01, nb02, nb03); break;
        case GGML_TYPE_IQ4_NL: dequantize_x8_rows<GGML_TYPE_IQ4_NL, T><<<grid, 256, 0, stream>>>(xc, y, ne00, ne01, ne02, ne03, nb01, nb02, nb03); break;
        default: GGML_ABORT("fatal error");
    }
    CUDA_CHECK(cudaGetLastError());
}

// llama-vq: the types dequantize_x8_rows_cuda takes; the short-row K*Q and the quantized OUT_PROD take exactly these
// (their kernels and GEMM paths dequantize through this file)
static bool dequantize_x8_type_supported(const ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_IQ4_NL:
            return true;
        default:
            return false;
    }
}

// F32 tensor with strides (in elements) s0..s3 -> T, contiguous [ne0, ne1, ne2, ne3]; dim 0 is the fastest in y
template <typename T>
static __global__ void copy_strided_f32(
        const float * __restrict__ x, T * __restrict__ y, const int ne0, const int ne1, const int ne2, const int ne3,
        const int64_t s0, const int64_t s1, const int64_t s2, const int64_t s3) {
    const int i0 = blockIdx.x*blockDim.x + threadIdx.x;
    if (i0 >= ne0) {
        return;
    }
    for (int i3 = 0; i3 < ne3; ++i3) {
        for (int i2 = blockIdx.z; i2 < ne2; i2 += gridDim.z) {
            for (int i1 = blockIdx.y; i1 < ne1; i1 += gridDim.y) {
                y[((int64_t) (i3*ne2 + i2)*ne1 + i1)*ne0 + i0] = ggml_cuda_cast<T>(x[i0*s0 + i1*s1 + i2*s2 + i3*s3]);
            }
        }
    }
}

template <typename T>
static void copy_strided_f32_cuda(
        const float * x, T * y, const int64_t ne0, const int64_t ne1, const int64_t ne2, const int64_t ne3,
        const int64_t s0, const int64_t s1, const int64_t s2, const int64_t s3, cudaStream_t stream) {
    const dim3 grid((ne0 + 255)/256, std::min<int64_t>(ne1, 65535), std::min<int64_t>(ne2, 65535));
    copy_strided_f32<T><<<grid, 256, 0, stream>>>(x, y, ne0, ne1, ne2, ne3, s0, s1, s2, s3);
    CUDA_CHECK(cudaGetLastError());
}

// C[:, :, b] = op(A[:, :, b]) * B[:, :, b] for b in [0, batch), column-major, T = half or float; F32 C.
// T = float runs cublasSgemmStridedBatched, in TF32 with the handles ggml creates (CUBLAS_TF32_TENSOR_OP_MATH).
template <typename T>
static void gemm_strided_batched_cuda(
        cublasHandle_t handle, const bool trans_a, const int64_t m, const int64_t n, const int64_t k,
        const T * a, const int64_t lda, const int64_t stride_a,
        const T * b, const int64_t ldb, const int64_t stride_b,
        float * c, const int64_t ldc, const int64_t stride_c, const int64_t batch) {
    const float alpha = 1.0f;
    const float beta  = 0.0f;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    if constexpr (std::is_same_v<T, float>) {
        CUBLAS_CHECK(cublasSgemmStridedBatched(handle, op_a, CUBLAS_OP_N, m, n, k,
                &alpha, a, lda, stride_a, b, ldb, stride_b, &beta, c, ldc, stride_c, batch));
    } else {
        static_assert(std::is_same_v<T, half>, "bad type");
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_a, CUBLAS_OP_N, m, n, k,
                &alpha, a, CUDA_R_16F, lda, stride_a, b, CUDA_R_16F, ldb, stride_b,
                &beta,  c, CUDA_R_32F, ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
    }
}

// LLAMA_VQ_CUDA_FORCE_F16_GEMM=1: the F16 GEMM on NVIDIA too, so that the branch HIP (MI210) takes runs on an
// NVIDIA GPU in our checks (the same dequantization, conversion and GemmEx call; cuBLAS instead of hipBLAS)
static bool dequantize_x8_gemm_force_f16() {
    static const bool force = [] {
        const char * env = getenv("LLAMA_VQ_CUDA_FORCE_F16_GEMM");
        const bool   on  = env != nullptr && atoi(env) != 0;
        if (on) {
            // read on the first large-batch GEMM: the line says that the forced branch was reached
            GGML_LOG_INFO("%s: LLAMA_VQ_CUDA_FORCE_F16_GEMM=1: F16 GEMM (the HIP branch) for quantized src0\n", __func__);
        }
        return on;
    }();
    return force;
}

// F32 GEMMs with TF32 tensor cores (NVIDIA Ampere+) skip the F16 conversion of the F32 operand; elsewhere F16
static bool dequantize_x8_gemm_use_f32(const int cc) {
    return GGML_CUDA_CC_IS_NVIDIA(cc) && cc >= GGML_CUDA_CC_AMPERE && !dequantize_x8_gemm_force_f16();
}
