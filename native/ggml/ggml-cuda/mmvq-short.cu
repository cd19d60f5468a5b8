#include "mmvq-short.cuh"
#include "dequantize-x8.cuh"

// dst[i01, i11, i12, i13] = sum_i00 src0[i00, i01, i12/r2, i13/r3] * src1[i00, i11, i12, i13]
//
// For the non-FA attention with a quantized K cache, src0 is [n_embd_head_k, n_kv, n_head_kv] (a permuted view of
// the cache) and src1 the queries [n_embd_head_k, n_tokens, n_head]: the rows are short (64..576 values) and each
// row is shared by the r2*r3*ne11 src1 columns of its src0 matrix. mul_mat_vec_q maps a warp onto one long row and
// re-reads a src0 row for every src1 channel; here tpr threads (a power of 2 that divides the warp) share a row,
// each dequantizes 8 values at a time, and all the columns that share the row are computed from one read.
// src1 stays F32 (no q8_1 quantization). More than MMVQ_SHORT_MAX_COLS columns (prefill): dequantize to F16 once + cuBLAS.

#define MMVQ_SHORT_NTHREADS 128
#define MMVQ_SHORT_MAX_COLS 8
#define MMVQ_SHORT_MAX_NE00 1024

// grid: x = chunk of rows_per_block src0 rows, y = src0 matrix (i02 + ne02*i03), z = tile of ncols columns
// columns of a src0 matrix are ordered (i11, i12 % r2, i13 % r3), i11 fastest
template <ggml_type type, int ncols, int tpr>
static __global__ void __launch_bounds__(MMVQ_SHORT_NTHREADS) mul_mat_vec_q_short(
        const char * __restrict__ src0, const float * __restrict__ src1, float * __restrict__ dst,
        const int ne00, const int ne01, const int ne02, const int ne11, const int r2, const int r3,
        const int64_t nb01, const int64_t nb02, const int64_t nb03,
        const int64_t s11, const int64_t s12, const int64_t s13,
        const int64_t s1, const int64_t s2, const int64_t s3,
        const int rows_per_block, const int hadamard_n) {
    constexpr int qr  = ggml_cuda_type_traits<type>::qr;
    constexpr int rpi = MMVQ_SHORT_NTHREADS/tpr; // rows per iteration
    constexpr int U   = ncols >= 8 ? 2 : 4;      // iterations in flight

    extern __shared__ float y_sh[]; // [ncols][ne00]

    const int tid    = threadIdx.x;
    const int rg     = tid/tpr;
    const int lane   = tid%tpr;
    const int nslots = ne00/(8*tpr);

    const int im  = blockIdx.y;
    const int i03 = im/ne02;
    const int i02 = im%ne02;

    const int ncols_total = ne11*r2*r3;

    // hadamard_n > 0: src1 holds the queries before their Hadamard rotation (a rotated K cache): scaled here,
    // transformed in shared memory below
    const float yscale = hadamard_n > 0 ? rsqrtf((float) hadamard_n) : 1.0f;

    int64_t offd[ncols];
    bool    valid[ncols];
#pragma unroll
    for (int c = 0; c < ncols; ++c) {
        const int ic = min((int) blockIdx.z*ncols + c, ncols_total - 1);
        valid[c] = (int) blockIdx.z*ncols + c < ncols_total;

        const int i11 = ic % ne11;
        const int i12 = i02*r2 + (ic/ne11) % r2;
        const int i13 = i03*r3 +  ic/(ne11*r2);

        offd[c] = i11*s1 + i12*s2 + i13*s3;

        const float * y = src1 + i11*s11 + i12*s12 + i13*s13;
        for (int i00 = tid; i00 < ne00; i00 += MMVQ_SHORT_NTHREADS) {
            y_sh[c*ne00 + i00] = valid[c] ? y[i00]*yscale : 0.0f;
        }
    }
    __syncthreads();

    if (hadamard_n > 0) {
        // Walsh-Hadamard transform of every segment of hadamard_n values (ne00 is a multiple of it):
        // butterflies (i, i + h) within blocks of 2h values, for h = 1 .. hadamard_n/2
        const int npairs = ncols*ne00/2;
        for (int h = 1; h < hadamard_n; h *= 2) {
            for (int p = tid; p < npairs; p += MMVQ_SHORT_NTHREADS) {
                const int i = (p/h)*(2*h) + p%h;
                const float a = y_sh[i];
                const float b = y_sh[i + h];
                y_sh[i]     = a + b;
                y_sh[i + h] = a - b;
            }
            __syncthreads();
        }
    }

    const int k0 = blockIdx.x*rows_per_block;
    const int k1 = min(k0 + rows_per_block, ne01);

    src0 += i02*nb02 + i03*nb03;

    // every thread runs the same number of iterations: the reduction below shuffles within groups of tpr lanes
    for (int kb = k0; kb < k1; kb += U*rpi) {
        float sum[U][ncols] = {{0.0f}};

        for (int is = 0; is < nslots; ++is) {
            const int j = lane + is*tpr;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k  = min(kb + u*rpi + rg, k1 - 1);
                float v[8];
                dequantize_x8<type>(src0 + k*nb01, j, v);
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    const float4 y0 = *((const float4 *) (y_sh + c*ne00 + dequantize_x8_pos<qr>(j, 0)));
                    const float4 y1 = *((const float4 *) (y_sh + c*ne00 + dequantize_x8_pos<qr>(j, 4)));
                    sum[u][c] += v[0]*y0.x + v[1]*y0.y + v[2]*y0.z + v[3]*y0.w
                               + v[4]*y1.x + v[5]*y1.y + v[6]*y1.z + v[7]*y1.w;
                }
            }
        }

#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = kb + u*rpi + rg;
#pragma unroll
            for (int c = 0; c < ncols; ++c) {
                const float s = warp_reduce_sum<tpr>(sum[u][c]);
                if (lane == 0 && valid[c] && k < k1) {
                    dst[offd[c] + k] = s;
                }
            }
        }
    }
}

bool ggml_cuda_should_use_mmvq_short(const ggml_tensor * src0, const ggml_tensor * src1, const ggml_tensor * dst) {
    if (!dequantize_x8_type_supported(src0->type) || src1->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32) {
        return false;
    }
    // only batched products with broadcast or several src1 channels (attention), never a 2D weight matrix
    if (src1->ne[2]*src1->ne[3] == 1) {
        return false;
    }
    if (src0->ne[0] > MMVQ_SHORT_MAX_NE00 || src0->ne[0] % 32 != 0 || src0->nb[0] != ggml_type_size(src0->type)) {
        return false;
    }
    if (src1->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float)) {
        return false;
    }
    return true;
}

template <ggml_type type, int ncols, int tpr>
static void mul_mat_vec_q_short_launch(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
        const int ntiles, const int hadamard_n) {
    GGML_TENSOR_BINARY_OP_LOCALS

    const int id  = ggml_cuda_get_device();
    const int nsm = ggml_cuda_info().devices[id].nsm;

    const int64_t r2   = ne12/ne02;
    const int64_t r3   = ne13/ne03;
    const int64_t nmat = ne02*ne03;

    constexpr int rpi = MMVQ_SHORT_NTHREADS/tpr;
    constexpr int U   = ncols >= 8 ? 2 : 4;

    // a few blocks per SM, rows_per_block a multiple of the rows one iteration covers
    int64_t rows_per_block = (ne01*nmat*ntiles + 4*nsm - 1)/(4*nsm);
    rows_per_block = std::max<int64_t>(rows_per_block, 2*U*rpi);
    rows_per_block = (rows_per_block + U*rpi - 1)/(U*rpi)*(U*rpi);
    const int64_t nchunks = (ne01 + rows_per_block - 1)/rows_per_block;

    GGML_ASSERT(nmat <= 65535 && ntiles <= 65535);
    const dim3   grid(nchunks, nmat, ntiles);
    const size_t smem = ncols*ne00*sizeof(float);

    mul_mat_vec_q_short<type, ncols, tpr><<<grid, MMVQ_SHORT_NTHREADS, smem, ctx.stream()>>>(
        (const char *) src0->data, (const float *) src1->data, (float *) dst->data,
        ne00, ne01, ne02, ne11, r2, r3, nb01, nb02, nb03,
        nb11/sizeof(float), nb12/sizeof(float), nb13/sizeof(float),
        nb1/sizeof(float), nb2/sizeof(float), nb3/sizeof(float), rows_per_block, hadamard_n);
    CUDA_CHECK(cudaGetLastError());
}

template <ggml_type type, int ncols>
static void mul_mat_vec_q_short_switch_tpr(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
        const int ntiles, const int hadamard_n) {
    // threads per row: the largest power of 2 <= 32 that divides the number of 8-value slots of a row
    const int64_t nslots = src0->ne[0]/8;
    if (nslots % 32 == 0) {
        mul_mat_vec_q_short_launch<type, ncols, 32>(ctx, src0, src1, dst, ntiles, hadamard_n);
    } else if (nslots % 16 == 0) {
        mul_mat_vec_q_short_launch<type, ncols, 16>(ctx, src0, src1, dst, ntiles, hadamard_n);
    } else if (nslots % 8 == 0) {
        mul_mat_vec_q_short_launch<type, ncols,  8>(ctx, src0, src1, dst, ntiles, hadamard_n);
    } else {
        mul_mat_vec_q_short_launch<type, ncols,  4>(ctx, src0, src1, dst, ntiles, hadamard_n);
    }
}

template <ggml_type type>
static void mul_mat_vec_q_short_switch_ncols(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
        const int hadamard_n) {
    const int64_t ncols_total = src1->ne[1] * (src1->ne[2]/src0->ne[2]) * (src1->ne[3]/src0->ne[3]);
    GGML_ASSERT(ncols_total <= MMVQ_SHORT_MAX_COLS);
    if (ncols_total <= 1) {
        mul_mat_vec_q_short_switch_tpr<type, 1>(ctx, src0, src1, dst, 1, hadamard_n);
    } else if (ncols_total <= 2) {
        mul_mat_vec_q_short_switch_tpr<type, 2>(ctx, src0, src1, dst, 1, hadamard_n);
    } else if (ncols_total <= 4) {
        mul_mat_vec_q_short_switch_tpr<type, 4>(ctx, src0, src1, dst, 1, hadamard_n);
    } else {
        mul_mat_vec_q_short_switch_tpr<type, 8>(ctx, src0, src1, dst, (ncols_total + 7)/8, hadamard_n);
    }
}

// more columns: src0 -> T once, src1 -> T contiguous, then per src1 channel i13 one GEMM
// per src0 matrix over all of its columns: dst[ne01, ne11*r2] = src0_T[ne00, ne01]^T * src1_T[ne00, ne11*r2]
// (the r2 channels that share a src0 matrix are consecutive columns in src1_T and dst)
template <typename T>
static void mul_mat_q_short_gemm(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst) {
    GGML_TENSOR_BINARY_OP_LOCALS

    GGML_ASSERT(ggml_is_contiguous(dst));

    cudaStream_t stream = ctx.stream();

    const int64_t r2 = ne12/ne02;
    const int64_t r3 = ne13/ne03;

    ggml_cuda_pool_alloc<T> src0_t(ctx.pool(), ggml_nelements(src0));
    dequantize_x8_rows_cuda<T>(src0->type, src0->data, src0_t.get(), ne00, ne01, ne02, ne03, nb01, nb02, nb03, stream);

    const T * src1_t_ptr = nullptr;
    ggml_cuda_pool_alloc<T> src1_t(ctx.pool());
    if (std::is_same_v<T, float> && ggml_is_contiguous(src1)) {
        src1_t_ptr = (const T *) src1->data;
    } else {
        src1_t.alloc(ggml_nelements(src1));
        copy_strided_f32_cuda<T>((const float *) src1->data, src1_t.get(), ne10, ne11, ne12, ne13,
                nb10/sizeof(float), nb11/sizeof(float), nb12/sizeof(float), nb13/sizeof(float), stream);
        src1_t_ptr = src1_t.get();
    }

    cublasHandle_t handle = ctx.cublas_handle();
    for (int64_t i13 = 0; i13 < ne13; ++i13) {
        gemm_strided_batched_cuda<T>(handle, true, ne01, ne11*r2, ne00,
                src0_t.get() + (i13/r3)*ne02*ne01*ne00, ne00, ne01*ne00,
                src1_t_ptr   +  i13*ne12*ne11*ne10,     ne10, r2*ne11*ne10,
                (float *) dst->data + i13*ne2*ne1*ne0,  ne0,  r2*ne1*ne0,
                ne02);
    }
}

static void mul_mat_vec_q_short_switch_type(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
        const int hadamard_n) {
    switch (src0->type) {
        case GGML_TYPE_Q4_0:   mul_mat_vec_q_short_switch_ncols<GGML_TYPE_Q4_0>  (ctx, src0, src1, dst, hadamard_n); break;
        case GGML_TYPE_Q4_1:   mul_mat_vec_q_short_switch_ncols<GGML_TYPE_Q4_1>  (ctx, src0, src1, dst, hadamard_n); break;
        case GGML_TYPE_Q5_0:   mul_mat_vec_q_short_switch_ncols<GGML_TYPE_Q5_0>  (ctx, src0, src1, dst, hadamard_n); break;
        case GGML_TYPE_Q5_1:   mul_mat_vec_q_short_switch_ncols<GGML_TYPE_Q5_1>  (ctx, src0, src1, dst, hadamard_n); break;
        case GGML_TYPE_Q8_0:   mul_mat_vec_q_short_switch_ncols<GGML_TYPE_Q8_0>  (ctx, src0, src1, dst, hadamard_n); break;
        case GGML_TYPE_IQ4_NL: mul_mat_vec_q_short_switch_ncols<GGML_TYPE_IQ4_NL>(ctx, src0, src1, dst, hadamard_n); break;
        default: GGML_ABORT("fatal error");
    }
}

void ggml_cuda_mul_mat_vec_q_short(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst) {
    GGML_ASSERT(ggml_cuda_should_use_mmvq_short(src0, src1, dst));
    GGML_ASSERT(src0->ne[0] == src1->ne[0]);
    GGML_ASSERT(src0->ne[1] == dst->ne[0]);

    const int64_t ncols_total = src1->ne[1] * (src1->ne[2]/src0->ne[2]) * (src1->ne[3]/src0->ne[3]);
    if (ncols_total > MMVQ_SHORT_MAX_COLS) {
        // F16 also where TF32 is available: src1 (the queries) is small, and F16 src0 is half the bytes of F32
        mul_mat_q_short_gemm<half>(ctx, src0, src1, dst);
        return;
    }

    mul_mat_vec_q_short_switch_type(ctx, src0, src1, dst, 0);
}

bool ggml_cuda_mmvq_short_can_rotate_src1(const ggml_tensor * src0, const ggml_tensor * src1, const ggml_tensor * dst, const int hadamard_n) {
    if (!ggml_cuda_should_use_mmvq_short(src0, src1, dst) || src0->ne[0] != src1->ne[0] || src0->ne[1] != dst->ne[0]) {
        return false;
    }
    const int64_t ncols_total = src1->ne[1] * (src1->ne[2]/src0->ne[2]) * (src1->ne[3]/src0->ne[3]);
    return ncols_total <= MMVQ_SHORT_MAX_COLS && hadamard_n >= 2 && hadamard_n <= MMVQ_SHORT_MAX_NE00 &&
           (hadamard_n & (hadamard_n - 1)) == 0 && src1->ne[0] % hadamard_n == 0;
}

void ggml_cuda_mul_mat_vec_q_short_rotated(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
        const int hadamard_n) {
    GGML_ASSERT(ggml_cuda_mmvq_short_can_rotate_src1(src0, src1, dst, hadamard_n));
    mul_mat_vec_q_short_switch_type(ctx, src0, src1, dst, hadamard_n);
}
