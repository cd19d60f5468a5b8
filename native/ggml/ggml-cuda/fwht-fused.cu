#include "fwht-fused.cuh"
#include "fwht.cuh"
#include "cpy-utils.cuh"

// one warp per segment of N values (a row of the Hadamard product), FWHT_FUSED_ROWS warps per block
#define FWHT_FUSED_ROWS 4

// reg[j] holds element j*warp_size + lane of a segment of el_w*warp_size values; on return, its unnormalized
// Walsh-Hadamard transform (Sylvester order, as ggml_gen_hadamard and fwht.cu)
template <int el_w>
static __device__ __forceinline__ void fwht_warp_inplace(float (&reg)[el_w]) {
    constexpr int warp_size = ggml_cuda_get_physical_warp_size();
    const int lane = threadIdx.x;

    // index bits below warp_size: pairs of lanes
#pragma unroll
    for (int h = 1; h < warp_size; h *= 2) {
#pragma unroll
        for (int j = 0; j < el_w; ++j) {
            const float other = __shfl_xor_sync(0xFFFFFFFF, reg[j], h, warp_size);
            reg[j] = (lane & h) ? other - reg[j] : reg[j] + other;
        }
    }

    // the bits above: pairs of registers
#pragma unroll
    for (int h = 1; h < el_w; h *= 2) {
#pragma unroll
        for (int j = 0; j < el_w; j += 2*h) {
#pragma unroll
            for (int k = 0; k < h; ++k) {
                const float x = reg[j + k];
                const float y = reg[j + k + h];
                reg[j + k]     = x + y;
                reg[j + k + h] = x - y;
            }
        }
    }
}

// the rotary embedding (GGML_OP_ROPE, NORMAL or NEOX, forward) of value i0 of a head row whose values [r0, r0 + N)
// are seg[]:
// the pair's angle as ggml's rope (theta = pos*theta_scale^p / freq_factor[p], YaRN's ramp and magnitude scale), and
// the rotated value that lands at i0 (values outside the rotated window pass through)
static __device__ __forceinline__ float fwht_rope_value(const fwht_rope_params & rp, const float * seg, const int r0,
        const int i0, const float pos) {
    const int iw = i0 - rp.n_offs;
    if (iw < 0 || iw >= rp.n_dims) {
        return seg[i0 - r0];
    }
    int p;      // the pair
    int i_lo;   // its first value (x0), then its second (x1)
    int i_hi;
    if (rp.neox) {
        const int half = rp.n_dims/2;
        p    = iw < half ? iw : iw - half;
        i_lo = rp.n_offs + p;
        i_hi = i_lo + half;
    } else {
        p    = iw/2;
        i_lo = rp.n_offs + 2*p;
        i_hi = i_lo + 1;
    }
    const float theta_base  = pos*powf(rp.theta_scale, (float) p);
    const float theta_extra = rp.freq_factors ? theta_base/rp.freq_factors[p] : theta_base;
    float theta  = rp.freq_scale*theta_extra;
    float mscale = rp.attn_factor;
    if (rp.ext_factor != 0.0f) {
        const float y    = (p - rp.corr_low)/fmaxf(0.001f, rp.corr_high - rp.corr_low);
        const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y)))*rp.ext_factor;
        theta   = theta*(1.0f - ramp) + theta_extra*ramp;
        mscale *= 1.0f + 0.1f*logf(1.0f/rp.freq_scale);
    }
    const float c  = cosf(theta)*mscale;
    const float sn = sinf(theta)*mscale;
    const float x0 = seg[i_lo - r0];
    const float x1 = seg[i_hi - r0];
    return i0 == i_lo ? x0*c - x1*sn : x0*sn + x1*c;
}

// ROPE: segment g's N values of the rope's output, times scale, into reg (element j*warp_size + lane in reg[j]):
// values [r0, r0 + N) of rope output row (i1, i2, i3) (its output is contiguous, its rows a multiple of N), read from
// the strided source row into seg, then each rotated with its pair's partner. Every thread of the block calls it (two
// block barriers); segments past nseg read and write nothing. On return seg is free again
template <int N>
static __device__ __forceinline__ void fwht_rope_segment(const fwht_rope_params & rp, float * seg, const int64_t g,
        const int64_t nseg, const float scale, float (&reg)[N/ggml_cuda_get_physical_warp_size()]) {
    constexpr int warp_size = ggml_cuda_get_physical_warp_size();
    constexpr int el_w      = N/warp_size;
    const int lane = threadIdx.x;

    const int64_t e  = g*N;
    const int     r0 = (int) (e % rp.ne0);
    const int64_t r  = e / rp.ne0;
    const int64_t i1 = r % rp.ne1;
    const int64_t i2 = (r / rp.ne1) % rp.ne2;
    const int64_t i3 = r / (rp.ne1*rp.ne2);
    if (g < nseg) {
        const float * xs = (const float *) (rp.src + i1*rp.nb1 + i2*rp.nb2 + i3*rp.nb3) + r0;
#pragma unroll
        for (int j = 0; j < el_w; ++j) {
            seg[j*warp_size + lane] = xs[j*warp_size + lane];
        }
    }
    __syncthreads();
    if (g < nseg) {
        const float pos = (float) rp.pos[i2];
#pragma unroll
        for (int j = 0; j < el_w; ++j) {
            reg[j] = fwht_rope_value(rp, seg, r0, r0 + j*warp_size + lane, pos) * scale;
        }
    }
    __syncthreads(); // every lane has read seg: the transform's results replace it
}

// fwht -> SET_ROWS: segment g of the contiguous F32 source x is transformed, staged in shared memory and quantized
// into the destination row that the set_rows index picks for it (k_set_rows_quant's indexing). ROPE: x is
// the output of a rope that runs here too: segment g's source values are read from the rope's (strided) source into
// shared memory, each lane rotates its values with their pairs' partners (ggml_cuda_rope_fwht_set_rows_supported:
// both in the segment), then the transform as above
template <int N, typename idx_t, typename block_type, int qk, void (*quantize)(const float *, block_type *), bool ROPE>
static __global__ void __launch_bounds__(FWHT_FUSED_ROWS*ggml_cuda_get_physical_warp_size(), 1)
k_fwht_set_rows(const float * x, const idx_t * idx, char * dst,
        const int64_t nseg, const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t ne11,
        const int64_t ne12, const int64_t s10, const int64_t s11, const int64_t s12,
        const int64_t nb1, const int64_t nb2, const int64_t nb3, const float scale, const fwht_rope_params rp) {
    constexpr int warp_size = ggml_cuda_get_physical_warp_size();
    constexpr int el_w      = N/warp_size;
    static_assert(N % warp_size == 0 && N % qk == 0, "bad segment size");

    __shared__ float buf[FWHT_FUSED_ROWS][N];

    const int64_t g = (int64_t) blockIdx.x*blockDim.y + threadIdx.y;
    const int lane = threadIdx.x;

    ggml_cuda_pdl_sync();

    // lanes quantize blocks that other lanes staged: a block barrier, not ggml_cuda_syncwarp (a no-op on HIP,
    // which would leave the 64-wide wavefront's shared-memory exchange to the compiler's instruction order)
    float * seg = buf[threadIdx.y];
    float reg[el_w];
    if constexpr (ROPE) {
        fwht_rope_segment<N>(rp, seg, g, nseg, scale, reg);
    }
    if (g < nseg) {
        if constexpr (!ROPE) {
            const float * xs = x + g*N;
#pragma unroll
            for (int j = 0; j < el_w; ++j) {
                reg[j] = xs[j*warp_size + lane] * scale;
            }
        }

        fwht_warp_inplace<el_w>(reg);

#pragma unroll
        for (int j = 0; j < el_w; ++j) {
            seg[j*warp_size + lane] = reg[j];
        }
    }
    __syncthreads();
    if (g >= nseg) {
        return;
    }

    // segment g covers columns [i00, i00 + N) of row (i01, i02, i03) of the set_rows source
    const int64_t e   = g*N;
    const int64_t i00 = e % ne00;
    const int64_t r   = e / ne00;
    const int64_t i01 = r % ne01;
    const int64_t i02 = (r / ne01) % ne02;
    const int64_t i03 = r / (ne01*ne02);

    const int64_t dst_row = idx[i01*s10 + (i02 % ne11)*s11 + (i03 % ne12)*s12];
    block_type * drow = (block_type *) (dst + dst_row*nb1 + i02*nb2 + i03*nb3) + i00/qk;

    for (int b = lane; b < N/qk; b += warp_size) {
        quantize(seg + b*qk, drow + b);
    }
}

template <int N, typename idx_t, typename block_type, int qk, void (*quantize)(const float *, block_type *)>
static void fwht_set_rows_launch(ggml_backend_cuda_context & ctx, const float * x, const ggml_tensor * data,
        const ggml_tensor * idx, ggml_tensor * dst, const fwht_rope_params * rope) {
    const int warp_size = ggml_cuda_info().devices[ggml_cuda_get_device()].warp_size;

    const int64_t nseg = ggml_nelements(data)/N;
    const dim3 grid((nseg + FWHT_FUSED_ROWS - 1)/FWHT_FUSED_ROWS, 1, 1);
    const dim3 block(warp_size, FWHT_FUSED_ROWS, 1);
    const ggml_cuda_kernel_launch_params params(grid, block, 0, ctx.stream());

#define FWHT_SET_ROWS_ARGS(rp) \
        x, (const idx_t *) idx->data, (char *) dst->data, nseg, \
        data->ne[0], data->ne[1], data->ne[2], idx->ne[1], idx->ne[2], \
        (int64_t) (idx->nb[0]/sizeof(idx_t)), (int64_t) (idx->nb[1]/sizeof(idx_t)), (int64_t) (idx->nb[2]/sizeof(idx_t)), \
        (int64_t) dst->nb[1], (int64_t) dst->nb[2], (int64_t) dst->nb[3], 1.0f/sqrtf((float) N), rp
    if (rope) {
        ggml_cuda_kernel_launch(k_fwht_set_rows<N, idx_t, block_type, qk, quantize, true>, params,
            FWHT_SET_ROWS_ARGS(*rope));
    } else {
        ggml_cuda_kernel_launch(k_fwht_set_rows<N, idx_t, block_type, qk, quantize, false>, params,
            FWHT_SET_ROWS_ARGS(fwht_rope_params{}));
    }
#undef FWHT_SET_ROWS_ARGS
}

template <int N, typename idx_t>
static void fwht_set_rows_switch_type(ggml_backend_cuda_context & ctx, const float * x, const ggml_tensor * data,
        const ggml_tensor * idx, ggml_tensor * dst, const fwht_rope_params * rope) {
    switch (dst->type) {
        case GGML_TYPE_Q4_0:
            fwht_set_rows_launch<N, idx_t, block_q4_0, QK4_0, quantize_f32_q4_0_block>(ctx, x, data, idx, dst, rope);
            break;
        case GGML_TYPE_Q4_1:
            fwht_set_rows_launch<N, idx_t, block_q4_1, QK4_1, quantize_f32_q4_1_block>(ctx, x, data, idx, dst, rope);
            break;
        case GGML_TYPE_Q5_0:
            fwht_set_rows_launch<N, idx_t, block_q5_0, QK5_0, quantize_f32_q5_0_block>(ctx, x, data, idx, dst, rope);
            break;
        case GGML_TYPE_Q5_1:
            fwht_set_rows_launch<N, idx_t, block_q5_1, QK5_1, quantize_f32_q5_1_block>(ctx, x, data, idx, dst, rope);
            break;
        case GGML_TYPE_Q8_0:
            fwht_set_rows_launch<N, idx_t, block_q8_0, QK8_0, quantize_f32_q8_0_block>(ctx, x, data, idx, dst, rope);
            break;
        case GGML_TYPE_IQ4_NL:
            fwht_set_rows_launch<N, idx_t, block_iq4_nl, QK4_NL, quantize_f32_iq4_nl_block>(ctx, x, data, idx, dst, rope);
            break;
        default:
            GGML_ABORT("fatal error");
    }
}

template <typename idx_t>
static void fwht_set_rows_switch_n(ggml_backend_cuda_context & ctx, const int n, const float * x, const ggml_tensor * data,
        const ggml_tensor * idx, ggml_tensor * dst, const fwht_rope_params * rope) {
    switch (n) {
        case  64: fwht_set_rows_switch_type< 64, idx_t>(ctx, x, data, idx, dst, rope); break;
        case 128: fwht_set_rows_switch_type<128, idx_t>(ctx, x, data, idx, dst, rope); break;
        case 256: fwht_set_rows_switch_type<256, idx_t>(ctx, x, data, idx, dst, rope); break;
        case 512: fwht_set_rows_switch_type<512, idx_t>(ctx, x, data, idx, dst, rope); break;
        default: GGML_ABORT("fatal error");
    }
}

static bool fwht_fused_n_supported(const int64_t n) {
    return n == 64 || n == 128 || n == 256 || n == 512;
}

bool ggml_cuda_fwht_set_rows_supported(const ggml_tensor * fwht, const ggml_tensor * set_rows) {
    if (!ggml_cuda_op_mul_mat_use_fwht(fwht) || fwht->src[1]->type != GGML_TYPE_F32 || set_rows->op != GGML_OP_SET_ROWS) {
        return false;
    }
    const int64_t n = fwht->src[0]->ne[0];
    if (!fwht_fused_n_supported(n)) {
        return false;
    }
    switch (set_rows->type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_IQ4_NL:
            break;
        default:
            return false;
    }
    const ggml_tensor * data = set_rows->src[0];
    const ggml_tensor * idx  = set_rows->src[1];
    // the stored rows are the transform's output itself, element for element
    if (data->view_src != fwht || data->view_offs != 0 || data->type != GGML_TYPE_F32 || !ggml_is_contiguous(data) ||
            ggml_nelements(data) != ggml_nelements(fwht)) {
        return false;
    }
    if (data->ne[0] % n != 0 || n % ggml_blck_size(set_rows->type) != 0) {
        return false;
    }
    return idx->type == GGML_TYPE_I64 || idx->type == GGML_TYPE_I32;
}

void ggml_cuda_op_fwht_set_rows(ggml_backend_cuda_context & ctx, const ggml_tensor * fwht, ggml_tensor * set_rows) {
    GGML_ASSERT(ggml_cuda_fwht_set_rows_supported(fwht, set_rows));

    const int           n    = fwht->src[0]->ne[0];
    const float *       x    = (const float *) fwht->src[1]->data;
    const ggml_tensor * data = set_rows->src[0];
    const ggml_tensor * idx  = set_rows->src[1];

    if (idx->type == GGML_TYPE_I64) {
        fwht_set_rows_switch_n<int64_t>(ctx, n, x, data, idx, set_rows, nullptr);
    } else {
        fwht_set_rows_switch_n<int32_t>(ctx, n, x, data, idx, set_rows, nullptr);
    }
}

bool ggml_cuda_rope_fwht_set_rows_supported(const ggml_tensor * rope, const ggml_tensor * fwht, const ggml_tensor * set_rows) {
    if (rope->op != GGML_OP_ROPE || !ggml_cuda_fwht_set_rows_supported(fwht, set_rows)) {
        return false;
    }
    const ggml_tensor * x   = rope->src[0];
    const ggml_tensor * pos = rope->src[1];
    const ggml_tensor * ff  = rope->src[2];
    const int32_t * op = (const int32_t *) rope->op_params;
    const int n_dims = op[1];
    const int mode   = op[2];
    const int n_offs = op[15];
    const int64_t n  = fwht->src[0]->ne[0];
    // the transform reads the rope's output (through views of the same bytes), contiguous and F32
    if (fwht->src[1]->view_src != rope || fwht->src[1]->view_offs != 0 || rope->type != GGML_TYPE_F32 ||
            !ggml_is_contiguous(rope) || ggml_nelements(fwht->src[1]) != ggml_nelements(rope)) {
        return false;
    }
    if ((mode != GGML_ROPE_TYPE_NORMAL && mode != GGML_ROPE_TYPE_NEOX) || x->type != GGML_TYPE_F32 ||
            x->nb[0] != sizeof(float) || pos->type != GGML_TYPE_I32 || pos->ne[0] < rope->ne[2] ||
            (ff && ff->type != GGML_TYPE_F32)) {
        return false;
    }
    // every rotated pair inside one segment of the transform: rows a multiple of n, the window in one segment (NEOX)
    // or pairs of neighbours (NORMAL)
    if (rope->ne[0] % n != 0 || n_dims < 2 || n_dims % 2 != 0 || n_offs < 0 || n_offs + n_dims > rope->ne[0]) {
        return false;
    }
    if (mode == GGML_ROPE_TYPE_NEOX ? n_offs/n != (n_offs + n_dims - 1)/n : n_offs % 2 != 0) {
        return false;
    }
    return rope->ne[0] <= INT32_MAX;
}

void ggml_cuda_op_rope_fwht_set_rows(ggml_backend_cuda_context & ctx, const ggml_tensor * rope, const ggml_tensor * fwht,
        ggml_tensor * set_rows) {
    GGML_ASSERT(ggml_cuda_rope_fwht_set_rows_supported(rope, fwht, set_rows));

    const ggml_tensor * x = rope->src[0];
    const int32_t * op = (const int32_t *) rope->op_params;
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    memcpy(&freq_base,   op +  5, sizeof(float));
    memcpy(&freq_scale,  op +  6, sizeof(float));
    memcpy(&ext_factor,  op +  7, sizeof(float));
    memcpy(&attn_factor, op +  8, sizeof(float));
    memcpy(&beta_fast,   op +  9, sizeof(float));
    memcpy(&beta_slow,   op + 10, sizeof(float));

    fwht_rope_params rp = {};
    rp.src          = (const char *) x->data;
    rp.pos          = (const int32_t *) rope->src[1]->data;
    rp.freq_factors = rope->src[2] ? (const float *) rope->src[2]->data : nullptr;
    rp.ne0 = rope->ne[0]; rp.ne1 = rope->ne[1]; rp.ne2 = rope->ne[2];
    rp.nb1 = x->nb[1]; rp.nb2 = x->nb[2]; rp.nb3 = x->nb[3];
    rp.n_dims      = op[1];
    rp.n_offs      = op[15];
    rp.neox        = op[2] == GGML_ROPE_TYPE_NEOX;
    rp.theta_scale = powf(freq_base, -2.0f/rp.n_dims);
    rp.freq_scale  = freq_scale;
    rp.ext_factor  = ext_factor;
    rp.attn_factor = attn_factor;
    float corr[2];
    ggml_rope_yarn_corr_dims(rp.n_dims, op[4], freq_base, beta_fast, beta_slow, corr);
    rp.corr_low  = corr[0];
    rp.corr_high = corr[1];

    const int           n    = fwht->src[0]->ne[0];
    const ggml_tensor * data = set_rows->src[0];
    const ggml_tensor * idx  = set_rows->src[1];
    if (idx->type == GGML_TYPE_I64) {
        fwht_set_rows_switch_n<int64_t>(ctx, n, nullptr, data, idx, set_rows, &rp);
    } else {
        fwht_set_rows_switch_n<int32_t>(ctx, n, nullptr, data, idx, set_rows, &rp);
    }
}

// CONT -> reshape -> fwht: segment g of the CONT's output order read from its strided F32 source
// (whose dim 0 is contiguous and a multiple of N), transformed and written to the contiguous output
template <int N>
static __global__ void __launch_bounds__(FWHT_FUSED_ROWS*ggml_cuda_get_physical_warp_size(), 1)
k_cont_fwht(const char * src, float * dst, const int64_t nseg,
        const int64_t ne00, const int64_t ne01, const int64_t ne02,
        const int64_t nb01, const int64_t nb02, const int64_t nb03, const float scale) {
    constexpr int warp_size = ggml_cuda_get_physical_warp_size();
    constexpr int el_w      = N/warp_size;

    const int64_t g = (int64_t) blockIdx.x*blockDim.y + threadIdx.y;
    if (g >= nseg) {
        return;
    }
    const int lane = threadIdx.x;

    const int64_t e   = g*N;
    const int64_t i00 = e % ne00;
    const int64_t r   = e / ne00;
    const int64_t i01 = r % ne01;
    const int64_t i02 = (r / ne01) % ne02;
    const int64_t i03 = r / (ne01*ne02);

    const float * xs = (const float *) (src + i01*nb01 + i02*nb02 + i03*nb03) + i00;

    ggml_cuda_pdl_sync();

    float reg[el_w];
#pragma unroll
    for (int j = 0; j < el_w; ++j) {
        reg[j] = xs[j*warp_size + lane] * scale;
    }

    fwht_warp_inplace<el_w>(reg);

    float * ds = dst + g*N;
#pragma unroll
    for (int j = 0; j < el_w; ++j) {
        ds[j*warp_size + lane] = reg[j];
    }
}

bool ggml_cuda_cont_fwht_supported(const ggml_tensor * cont, const ggml_tensor * fwht) {
    if (cont->op != GGML_OP_CONT || cont->type != GGML_TYPE_F32 || !ggml_cuda_op_mul_mat_use_fwht(fwht) ||
            fwht->src[1]->type != GGML_TYPE_F32 || fwht->src[1]->view_src != cont) {
        return false;
    }
    const ggml_tensor * src = cont->src[0];
    const int64_t       n   = fwht->src[0]->ne[0];
    return fwht_fused_n_supported(n) && src->type == GGML_TYPE_F32 && src->nb[0] == sizeof(float) && src->ne[0] % n == 0 &&
           ggml_nelements(src) == ggml_nelements(fwht);
}

void ggml_cuda_op_cont_fwht(ggml_backend_cuda_context & ctx, const ggml_tensor * cont, ggml_tensor * fwht) {
    GGML_ASSERT(ggml_cuda_cont_fwht_supported(cont, fwht));

    const ggml_tensor * src = cont->src[0];
    const int           n   = fwht->src[0]->ne[0];

    const int     warp_size = ggml_cuda_info().devices[ggml_cuda_get_device()].warp_size;
    const int64_t nseg      = ggml_nelements(fwht)/n;
    const dim3    grid((nseg + FWHT_FUSED_ROWS - 1)/FWHT_FUSED_ROWS, 1, 1);
    const dim3    block(warp_size, FWHT_FUSED_ROWS, 1);
    const ggml_cuda_kernel_launch_params params(grid, block, 0, ctx.stream());
    const float   scale = 1.0f/sqrtf((float) n);

    const char * s = (const char *) src->data;
    float *      d = (float *) fwht->data;

    switch (n) {
        case  64: ggml_cuda_kernel_launch(k_cont_fwht< 64>, params, s, d, nseg, src->ne[0], src->ne[1], src->ne[2], (int64_t) src->nb[1], (int64_t) src->nb[2], (int64_t) src->nb[3], scale); break;
        case 128: ggml_cuda_kernel_launch(k_cont_fwht<128>, params, s, d, nseg, src->ne[0], src->ne[1], src->ne[2], (int64_t) src->nb[1], (int64_t) src->nb[2], (int64_t) src->nb[3], scale); break;
        case 256: ggml_cuda_kernel_launch(k_cont_fwht<256>, params, s, d, nseg, src->ne[0], src->ne[1], src->ne[2], (int64_t) src->nb[1], (int64_t) src->nb[2], (int64_t) src->nb[3], scale); break;
        case 512: ggml_cuda_kernel_launch(k_cont_fwht<512>, params, s, d, nseg, src->ne[0], src->ne[1], src->ne[2], (int64_t) src->nb[1], (int64_t) src->nb[2], (int64_t) src->nb[3], scale); break;
        default: GGML_ABORT("fatal error");
    }
}
