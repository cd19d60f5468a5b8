#pragma once

// llama-vq: the fused decode attention's combine of its splits, a part of attn-decode-fused.cu (included there after
// ad_fwht_rows and ad_write_out; the CPU emulation of the tests includes it the same way): the separate kernel
// k_attn_decode_combine, and the same combine folded into the splits' kernels where the splits are few
// (ad_fold_combine).

// the combine's split weights w_z = exp(m_z - m) into w_sh [nsplit] (m: the largest split max and the sink), from
// the splits' (max, sum) at ml[z*stride]; all threads read their splits at once, and the maxima and sums are reduced
// per 32 lanes and then in a fixed order (deterministic); returns 1/(sum_z w_z l_z + exp(sink - m)). Uses w_sh
// [2*nsplit + AD_NT/32]; ends with every thread past the barriers that follow its last write of w_sh.
static __device__ __forceinline__ float ad_combine_weights(const float2 * ml, const int stride,
        const float * sink, const int nsplit, float * w_sh) {
    const int tid = threadIdx.x;
    float * l_sh = w_sh + nsplit;
    float * g_sh = l_sh + nsplit;
    constexpr int NG32 = AD_NT/32;

    float mx = -INFINITY;
    for (int z = tid; z < nsplit; z += AD_NT) {
        const float2 v = ml[(int64_t) z*stride];
        w_sh[z] = v.x;
        l_sh[z] = v.y;
        mx = fmaxf(mx, v.x);
    }
    mx = warp_reduce_max<32>(mx);
    if (tid % 32 == 0) {
        g_sh[tid/32] = mx;
    }
    __syncthreads();
    float m = sink ? *sink : -INFINITY;
#pragma unroll
    for (int g = 0; g < NG32; ++g) {
        m = fmaxf(m, g_sh[g]);
    }
    __syncthreads(); // every thread has read the maxima: g_sh is reused for the sums

    float ls = 0.0f;
    for (int z = tid; z < nsplit; z += AD_NT) {
        const float mz = w_sh[z];
        const float w  = mz == -INFINITY ? 0.0f : expf(mz - m);
        w_sh[z] = w;
        ls += w*l_sh[z];
    }
    ls = warp_reduce_sum<32>(ls);
    if (tid % 32 == 0) {
        g_sh[tid/32] = ls;
    }
    __syncthreads();
    float l = sink ? expf(*sink - m) : 0.0f;
#pragma unroll
    for (int g = 0; g < NG32; ++g) {
        l += g_sh[g];
    }
    return 1.0f/l;
}

// one block per (query column, KV head, stream): dst = sum_z exp(m_z - m) o_z / (sum_z exp(m_z - m) l_z + sink).
// The splits' maxima and sums are read by all threads at once and reduced in groups of 32 lanes and then in a fixed
// order (one thread walking them took ~7.5 us per layer at 32K on an H200, 64 splits); the partial
// outputs are summed by AD_NT/(dv/4) groups of threads at once (each thread 4 consecutive values, 4 splits' loads
// in flight), then the groups' sums in a fixed order: deterministic
static __global__ void __launch_bounds__(AD_NT) k_attn_decode_combine(const float * part_o,
        const float2 * part_ml, const float * sinks, float * dst, const int dv,
        const int ncols, const int ntok, const int gqa, const int n_head_kv, const int nsplit, const int64_t d_s1,
        const int64_t d_s2, const int64_t d_s3, const int out_rot) {
    // [nsplit] maxima, then weights; [nsplit] sums; [AD_NT/32] the lane groups' partials; then [groups][dv] sums
    extern __shared__ float w_sh[];

    const int tid  = threadIdx.x;
    const int col  = blockIdx.x;
    const int h    = blockIdx.y;
    const int s    = blockIdx.z;
    const int tok  = col % ntok;
    const int head = h*gqa + col / ntok;

    const int64_t blk0 = ((int64_t) s*n_head_kv + h)*nsplit;
    float * g_sh = w_sh + 2*nsplit;
    constexpr int NG32 = AD_NT/32;

    // launched early behind k_attn_decode: its partials are read after it has finished
    ggml_cuda_pdl_sync();

    const float il = ad_combine_weights(part_ml + blk0*ncols + col, ncols, sinks ? sinks + head : nullptr, nsplit, w_sh);

    const int nvec = dv/4;         // float4 per row (dv is a multiple of 32)
    const int ng   = AD_NT/nvec;   // groups of splits (>= 2: dv <= 256)
    const int g    = tid/nvec;
    const int e    = tid - g*nvec;
    float * red = g_sh + NG32;
    if (g < ng) {
        constexpr int U = 4;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 * src = (const float4 *) (part_o + (blk0*ncols + col)*dv) + e;
        const int64_t zst = (int64_t) ncols*nvec; // float4 between splits
        int z = g;
        for (; z + (U - 1)*ng < nsplit; z += U*ng) {
            float4 t[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                t[u] = src[(z + u*ng)*zst];
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float w = w_sh[z + u*ng];
                o.x += w*t[u].x; o.y += w*t[u].y; o.z += w*t[u].z; o.w += w*t[u].w;
            }
        }
        for (; z < nsplit; z += ng) {
            const float4 t = src[z*zst];
            const float  w = w_sh[z];
            o.x += w*t.x; o.y += w*t.y; o.z += w*t.z; o.w += w*t.w;
        }
        red[g*dv + 4*e + 0] = o.x;
        red[g*dv + 4*e + 1] = o.y;
        red[g*dv + 4*e + 2] = o.z;
        red[g*dv + 4*e + 3] = o.w;
    }
    __syncthreads();
    for (int i0 = tid; i0 < dv; i0 += AD_NT) {
        float o = 0.0f;
        for (int gg = 0; gg < ng; ++gg) {
            o += red[gg*dv + i0];
        }
        if (out_rot > 0) {
            red[i0] = o*il; // only this thread reads red[gg*dv + i0]
        } else {
            dst[tok*d_s1 + head*d_s2 + s*d_s3 + i0] = o*il;
        }
    }
    if (out_rot > 0) {
        ad_fwht_rows(red, dv, out_rot);
        for (int i0 = tid; i0 < dv; i0 += AD_NT) {
            dst[tok*d_s1 + head*d_s2 + s*d_s3 + i0] = red[i0];
        }
    }
}

// a split's partial of another block, read past the L1 (which is not coherent between SMs): NVIDIA's ld.global.cg;
// HIP's volatile loads are glc loads, which bypass the vector L1 the same way
static __device__ __forceinline__ float4 ad_ld_cg4(const float * ptr) {
#ifdef GGML_USE_HIP
    const volatile float * v = ptr;
    return make_float4(v[0], v[1], v[2], v[3]);
#else
    return __ldcg((const float4 *) ptr);
#endif // GGML_USE_HIP
}

static __device__ __forceinline__ float2 ad_ld_cg2(const float2 * ptr) {
#ifdef GGML_USE_HIP
    const volatile float * v = (const volatile float *) ptr;
    return make_float2(v[0], v[1]);
#else
    return __ldcg(ptr);
#endif // GGML_USE_HIP
}

// The combine folded into the splits' kernel (p.fold, where the splits are few: attn_decode_fold_plan): every block
// has written its partial (ad_write_out); the last of the nsplit blocks of a (stream, KV head, tile of columns) to
// count itself in combines the nsplit partials of the tile's nc columns, so that a layer needs no second launch.
// The count is atomicInc's, which wraps to 0 on the last block: the counts stay 0 between launches. Per column (a
// group of 32 lanes, one split each: nsplit <= 32) the largest split max m, with the sink, the weights
// exp(m_z - m) and 1/(sum_z w_z l_z + exp(sink - m)); then each thread 4 values of d_v of a column, the splits summed
// in their order (8 loads in flight): deterministic. red: shared memory of at least attn_decode_fold_floats floats
// that the block no longer needs. Every thread of the block calls it; the block's threads leave together.
static __device__ __forceinline__ void ad_fold_combine(const attn_decode_params & p, float * red, const int col0,
        const int nc, const int h, const int s, const int tile) {
    __shared__ int last_sh[1];
    const int tid = threadIdx.x;
    const int nz  = p.nsplit;
    __threadfence(); // this block's partial is seen by whichever block combines
    __syncthreads();
    if (tid == 0) {
        const int64_t cnt = ((int64_t) s*p.n_head_kv + h)*p.ntiles + tile;
        last_sh[0] = atomicInc(p.fold + cnt, (unsigned) nz - 1) == (unsigned) nz - 1;
    }
    __syncthreads();
    if (!last_sh[0]) {
        return;
    }
    __threadfence(); // every other block's partial, fenced before its count, is seen from here on

    const int64_t blk0 = ((int64_t) s*p.n_head_kv + h)*nz;
    float * w_sh  = red + nc*p.dv;  // [nc][nz] the splits' maxima, then their weights
    float * l_sh  = w_sh + nc*nz;   // [nc][nz] the splits' sums
    float * il_sh = l_sh + nc*nz;   // [nc] 1/(the column's sum)
    for (int i = tid; i < nc*nz; i += AD_NT) {
        const int c = i / nz;
        const int z = i - c*nz;
        const float2 ml = ad_ld_cg2(p.part_ml + (blk0 + z)*p.ncols + col0 + c);
        w_sh[i] = ml.x;
        l_sh[i] = ml.y;
    }
    __syncthreads();
    // columns per group of 32 lanes, the same number of steps for every group (the shuffles' lanes all take part)
    const int lane = tid % 32;
    for (int c0 = 0; c0 < nc; c0 += AD_NT/32) {
        const int  c  = c0 + tid/32;
        const bool cz = c < nc && lane < nz;
        const int  head = h*p.gqa + min(col0 + c, p.ncols - 1) / p.ntok;
        const float mz = cz ? w_sh[c*nz + lane] : -INFINITY;
        float m = warp_reduce_max<32>(mz);
        if (p.sinks) {
            m = fmaxf(m, p.sinks[head]);
        }
        const float w = mz == -INFINITY ? 0.0f : expf(mz - m);
        float l = warp_reduce_sum<32>(cz ? w*l_sh[c*nz + lane] : 0.0f);
        if (cz) {
            w_sh[c*nz + lane] = w;
        }
        if (c < nc && lane == 0) {
            il_sh[c] = 1.0f/(l + (p.sinks ? expf(p.sinks[head] - m) : 0.0f));
        }
    }
    __syncthreads();
    const int nvec = p.dv/4;
    const int64_t zst = (int64_t) p.ncols*p.dv; // floats between two splits' partials of a column
    for (int i = tid; i < nc*nvec; i += AD_NT) {
        const int c = i / nvec;
        const int e = i - c*nvec;
        const float * src = p.part_o + (blk0*p.ncols + col0 + c)*p.dv + 4*e;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        constexpr int U = 8;
        for (int z0 = 0; z0 < nz; z0 += U) {
            float4 t[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                t[u] = z0 + u < nz ? ad_ld_cg4(src + (z0 + u)*zst) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float wz = z0 + u < nz ? w_sh[c*nz + z0 + u] : 0.0f;
                o.x += wz*t[u].x; o.y += wz*t[u].y; o.z += wz*t[u].z; o.w += wz*t[u].w;
            }
        }
        const float il = il_sh[c];
        red[c*p.dv + 4*e + 0] = o.x*il;
        red[c*p.dv + 4*e + 1] = o.y*il;
        red[c*p.dv + 4*e + 2] = o.z*il;
        red[c*p.dv + 4*e + 3] = o.w*il;
    }
    if (p.out_rot > 0) {
        ad_fwht_rows(red, nc*p.dv, p.out_rot); // rows of whole segments: d_v is a multiple of out_rot
    } else {
        __syncthreads();
    }
    for (int i = tid; i < nc*p.dv; i += AD_NT) {
        const int c    = i / p.dv;
        const int i0   = i - c*p.dv;
        const int col  = col0 + c;
        const int tok  = col % p.ntok;
        const int head = h*p.gqa + col / p.ntok;
        p.dst[tok*p.d_s1 + head*p.d_s2 + s*p.d_s3 + i0] = red[i];
    }
}
