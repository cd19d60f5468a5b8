// Runs the fused decode attention's CUDA kernels (attn-decode-fused.cu: k_attn_decode, k_attn_decode_combine) on the CPU
// (cuda_surface.h, launch.h): every block's 128 threads are fibers (fibers.h), __syncthreads() a block barrier, and a
// warp shuffle an exchange through memory between two barriers of the warp's lanes (a shuffle that not every lane of
// the warp reaches is a deadlock here, reported, as it is undefined on the GPU). The kernels' source and dequantize-x8.cuh are the files
// the build compiles (KERNEL_INC, DEQ_INC: cut out by tests/kernels/test_fused_attn_kernel_emulation.py through
// tests/support/kernel_sources.py); the launch configuration (splits, chunk width, shared memory size) is the host code's,
// restated below. Each case is compared with a float64 softmax(scale*K.Q + mask, sinks) V on the same quantized blocks,
// decoded here independently of dequantize_x8.
// Built for the CUDA surface (32-lane warps; the tiles staged by the kernels' cp.async code on an emulation of cp.async,
// whose copies land only when a wait covers them, into one or two tile buffers;
// the tensor-core V*P on an emulation of its two instructions, held to an NMSE bound of its own since V and P are
// rounded to f16 there) or, with -DGGML_USE_HIP, for gfx90a's (64-lane wavefronts, one tile buffer, the f32 V*P that
// LLAMA_VQ_CUDA_FUSED_ATTN=1 gives HIP, 64 KiB of LDS: cases past it are the host's to refuse and are skipped).
//
//   harness            runs the built-in cases, one line each, exit status 1 if any fails
#include <random>

#if !defined(GGML_USE_HIP)
// the two-buffer tile pipeline is NVIDIA's (cp.async): here its code runs on cuda_surface.h's emulation of cp.async
#define CP_ASYNC_AVAILABLE
#define AD_EMULATE_CP_ASYNC
#endif
#include "cuda_surface.h"
#include "launch.h"

// dequantize-x8.cuh's device part
#include DEQ_INC

#include KERNEL_INC

// ---- data, reference, cases ----
static size_t block_bytes(ggml_type t) {
    return t == GGML_TYPE_Q4_0 ? sizeof(block_q4_0) : t == GGML_TYPE_Q4_1 ? sizeof(block_q4_1) : sizeof(block_q8_0);
}

static uint16_t rand_half(std::mt19937 & g, int emin, int emax) { // a positive normal half in [2^(emin-15), 2^(emax-14))
    std::uniform_int_distribution<int> e(emin, emax), m(0, 1023);
    return (uint16_t) ((e(g) << 10) | m(g));
}

// row of d values: random blocks; decoded independently (ggml's block layouts: q4 elements j and j + 16 in byte j)
static void make_row(std::mt19937 & g, ggml_type t, int d, char * out, float * dec) {
    std::uniform_int_distribution<int> byte(0, 255);
    for (int b = 0; b < d/32; ++b) {
        if (t == GGML_TYPE_Q4_0) {
            block_q4_0 x; x.d.bits = rand_half(g, 9, 12);
            for (int j = 0; j < 16; ++j) x.qs[j] = (uint8_t) byte(g);
            for (int j = 0; j < 16; ++j) {
                dec[b*32 + j]      = fp16_to_fp32(x.d.bits) * ((x.qs[j] & 15) - 8);
                dec[b*32 + j + 16] = fp16_to_fp32(x.d.bits) * ((x.qs[j] >> 4) - 8);
            }
            std::memcpy(out + b*18, &x, 18);
        } else if (t == GGML_TYPE_Q4_1) {
            block_q4_1 x; x.dm.x.bits = rand_half(g, 9, 12); x.dm.y.bits = (uint16_t) (rand_half(g, 12, 14) | 0x8000);
            for (int j = 0; j < 16; ++j) x.qs[j] = (uint8_t) byte(g);
            for (int j = 0; j < 16; ++j) {
                dec[b*32 + j]      = fp16_to_fp32(x.dm.x.bits) * (x.qs[j] & 15) + fp16_to_fp32(x.dm.y.bits);
                dec[b*32 + j + 16] = fp16_to_fp32(x.dm.x.bits) * (x.qs[j] >> 4) + fp16_to_fp32(x.dm.y.bits);
            }
            std::memcpy(out + b*20, &x, 20);
        } else {
            block_q8_0 x; x.d.bits = rand_half(g, 5, 8);
            for (int j = 0; j < 32; ++j) x.qs[j] = (int8_t) (byte(g) - 128);
            for (int j = 0; j < 32; ++j) dec[b*32 + j] = fp16_to_fp32(x.d.bits) * x.qs[j];
            std::memcpy(out + b*34, &x, 34);
        }
    }
}

struct attn_case {
    ggml_type tk, tv;
    int dk, dv, n_head, n_head_kv, n_kv, ntok, n_stream;
    bool sinks, mask_f16;
    int n_rot, nsm;
    int nbuf; // K and V tile buffers: 2 as on NVIDIA sm_80+ (staged here by plain loads), 1 as on HIP
    bool tail = false; // the output permuted to [d_v, n_head, n_tokens, n_stream], contiguous
    int out_rot = 0;   // and every out_rot-segment of a row Hadamard-rotated (V's inverse rotation)
    bool vmma = false; // V*P on (emulated) tensor cores, V and P rounded to f16 (d_v 128)
    bool tc = false;   // k_attn_decode_tc: K*Q in int8 and V*P in f16 on (emulated) tensor cores
};

static const char * tname(ggml_type t) { return t == GGML_TYPE_Q4_0 ? "q4_0" : t == GGML_TYPE_Q4_1 ? "q4_1" : "q8_0"; }

// the queries as the kernel's K*Q sees them, in float64: rotated (scaled, then the butterflies in the kernel's order,
// in float32: the same floats), then int8 per 32 values (d = amax/127, q = round(x/d), float32 as the kernel and
// ggml's q8_0): the quantized queries are a choice of the kernel, the reference then checks everything else
// exactly
static std::vector<double> reference_queries(const attn_case & c, const std::vector<float> & q) {
    std::vector<float> qf(q.begin(), q.end());
    if (c.n_rot > 0) {
        const float ys = rsqrtf((float) c.n_rot);
        for (auto & x : qf) x *= ys;
        for (size_t s0 = 0; s0 < qf.size(); s0 += c.n_rot) {
            for (int hh = 1; hh < c.n_rot; hh *= 2) {
                for (int pr = 0; pr < c.n_rot/2; ++pr) {
                    const int i = (pr/hh)*(2*hh) + pr%hh;
                    const float a = qf[s0 + i], b = qf[s0 + i + hh];
                    qf[s0 + i] = a + b;
                    qf[s0 + i + hh] = a - b;
                }
            }
        }
    }
    std::vector<double> qd(qf.size());
    for (size_t b0 = 0; b0 < qf.size(); b0 += 32) {
        float amax = 0.0f;
        for (int l = 0; l < 32; ++l) amax = std::fmax(amax, std::fabs(qf[b0 + l]));
        const float d  = amax/127.0f;
        const float id = d != 0.0f ? 1.0f/d : 0.0f;
        for (int l = 0; l < 32; ++l) qd[b0 + l] = (double) std::round(qf[b0 + l]*id) * (double) d;
    }
    return qd;
}

// float64 softmax(scale*K.Q + mask, sinks) V for query token t of head h in stream s, then V's inverse rotation
// (c.out_rot > 0) as a matrix
static std::vector<double> reference_row(const attn_case & c, const std::vector<double> & qd, const std::vector<float> & kd,
        const std::vector<float> & vd, const std::vector<float> & mask, const std::vector<float> & sinks, const float scale,
        const int kv_size, const int s, const int h, const int t) {
    const int hk = h/(c.n_head/c.n_head_kv);
    std::vector<double> sc(c.n_kv);
    double mx = c.sinks ? sinks[h] : -INFINITY;
    for (int k = 0; k < c.n_kv; ++k) {
        const float * kr = kd.data() + (((size_t) s*kv_size + k)*c.n_head_kv + hk)*c.dk;
        const double * qq = qd.data() + (((size_t) s*c.ntok + t)*c.n_head + h)*c.dk;
        double d = 0;
        for (int i = 0; i < c.dk; ++i) d += kr[i]*qq[i];
        sc[k] = d*scale + mask[((size_t) s*c.ntok + t)*c.n_kv + k];
        mx = std::max(mx, sc[k]);
    }
    double sum = c.sinks ? std::exp(sinks[h] - mx) : 0.0;
    for (int k = 0; k < c.n_kv; ++k) { sc[k] = std::exp(sc[k] - mx); sum += sc[k]; }
    std::vector<double> orow(c.dv);
    for (int i = 0; i < c.dv; ++i) {
        double o = 0;
        for (int k = 0; k < c.n_kv; ++k) o += sc[k]*vd[(((size_t) s*kv_size + k)*c.n_head_kv + hk)*c.dv + i];
        orow[i] = o/sum;
    }
    if (c.out_rot > 0) { // the inverse V rotation as a matrix: (H x)[r] = sum_j (-1)^popcount(r & j) x[j] / sqrt(n)
        std::vector<double> rr(c.dv);
        for (int s0 = 0; s0 < c.dv; s0 += c.out_rot) {
            for (int r = 0; r < c.out_rot; ++r) {
                double a = 0;
                for (int j = 0; j < c.out_rot; ++j) {
                    a += (__builtin_popcount((unsigned) (r & j)) % 2 ? -1.0 : 1.0)*orow[s0 + j];
                }
                rr[s0 + r] = a/std::sqrt((double) c.out_rot);
            }
        }
        orow = rr;
    }
    return orow;
}

static bool run_case(const attn_case & c0, int seed) {
    attn_case c = c0;
#if defined(GGML_USE_HIP)
    // gfx90a: no tensor cores for the tensor-core V*P (NVIDIA's form only: the host never picks it on HIP) and no cp.async,
    // so one tile buffer (attn_decode_nbuf)
    if (c.vmma || c.tc) {
        return true;
    }
    c.nbuf = 1;
#endif
    if (c.tc && c.nbuf != 2) { // k_attn_decode_tc has two tile buffers only (attn_decode_tc_nbuf)
        fprintf(stderr, "a case of k_attn_decode_tc with %d tile buffer(s)\n", c.nbuf);
        abort();
    }
    std::mt19937 g(seed);
    const int kv_size = c.n_kv + 3;
    const size_t rk = block_bytes(c.tk)*(c.dk/32), rv = block_bytes(c.tv)*(c.dv/32);
    // caches: [n_head_kv heads per cell row][kv_size cells][n_stream], as llama_kv_cache; 16 bytes more, as a device
    // buffer has them (allocations in whole 16-byte units at least): rows staged as windows read the 16-byte units of
    // their first and last bytes
    std::vector<char>  kc(rk*c.n_head_kv*kv_size*c.n_stream + 16), vc(rv*c.n_head_kv*kv_size*c.n_stream + 16);
    std::vector<float> kd((size_t) c.dk*c.n_head_kv*kv_size*c.n_stream), vd((size_t) c.dv*c.n_head_kv*kv_size*c.n_stream);
    for (size_t r = 0; r < (size_t) c.n_head_kv*kv_size*c.n_stream; ++r) {
        make_row(g, c.tk, c.dk, kc.data() + r*rk, kd.data() + r*c.dk);
        make_row(g, c.tv, c.dv, vc.data() + r*rv, vd.data() + r*c.dv);
    }
    // queries [d_k, n_head, n_tokens, n_stream] contiguous, read through the permuted view [d_k, n_tokens, n_head, s]
    std::uniform_real_distribution<float> u(-3.0f, 3.0f), um(-1.0f, 1.0f), us(-2.0f, 4.0f);
    std::vector<float> q((size_t) c.dk*c.n_head*c.ntok*c.n_stream);
    for (auto & x : q) x = u(g);
    // mask [n_kv, ntok, 1, n_stream]: causal tail, holes, a masked window for long caches; cell 0 visible
    std::vector<float> mask((size_t) c.n_kv*c.ntok*c.n_stream);
    for (int s = 0; s < c.n_stream; ++s) for (int r = 0; r < c.ntok; ++r) for (int k = 0; k < c.n_kv; ++k) {
        const bool causal = k >= c.n_kv - c.ntok + r + 1;
        const bool hole   = (k*7 + r*13 + s*5) % 11 == 0;
        const bool window = c.n_kv >= 512 && k >= c.n_kv/4 && k < c.n_kv/2;
        float mv = k > 0 && (causal || hole || window) ? -INFINITY : um(g);
        if (c.mask_f16 && std::isfinite(mv)) {
            mv = std::round(mv*1024.0f)/1024.0f; // exactly representable in f16
        }
        mask[((size_t) s*c.ntok + r)*c.n_kv + k] = mv;
    }
    std::vector<half> mask16(mask.size());
    for (size_t i = 0; i < mask.size(); ++i) {
        const float mv = mask[i];
        uint16_t h = 0xFC00; // -inf
        if (std::isfinite(mv)) { // mv = n/1024 with |n| <= 1024: encode exactly
            const float a = std::fabs(mv);
            if (a == 0.0f) {
                h = 0;
            } else {
                int e; const float fr = std::frexp(a, &e); // a = fr * 2^e, fr in [0.5, 1)
                h = (uint16_t) (((e - 1 + 15) << 10) | (uint16_t) std::lround((fr*2.0f - 1.0f)*1024.0f));
            }
            if (mv < 0) h |= 0x8000;
        }
        mask16[i].bits = h;
        mask[i] = c.mask_f16 ? fp16_to_fp32(h) : mv;
    }
    std::vector<float> sinks(c.n_head);
    for (auto & x : sinks) x = us(g);
    const float scale = 1.0f/std::sqrt((float) c.dk);

    // the host code of ggml_cuda_attn_decode_fused (its planning functions are part of the kernels' source)
    attn_decode_params p = {};
    p.dk = c.dk; p.dv = c.dv; p.n_kv = c.n_kv; p.n_head_kv = c.n_head_kv; p.gqa = c.n_head/c.n_head_kv; p.ntok = c.ntok;
    p.ncols = p.ntok*p.gqa; p.ntiles = (p.ncols + AD_CT - 1)/AD_CT; p.hadamard_n = c.n_rot; p.scale = scale;
    p.rbk = (int) rk; p.rbv = (int) rv;
    if (c.tc) {
        p.ntiles = (p.ncols + AD_TC_COLS - 1)/AD_TC_COLS;
    }
    attn_decode_plan(p, c.n_stream, c.nsm, c.tc ? 3 : 4);
    const int64_t nsplit = p.nsplit;

    std::vector<float> qr = q; // the kernel reads the unrotated queries when n_rot > 0 (as the fused graph does)
    p.q = (const char *) qr.data();
    p.q_nb1 = (int64_t) c.dk*c.n_head*4; p.q_nb2 = (int64_t) c.dk*4; p.q_nb3 = (int64_t) c.dk*c.n_head*c.ntok*4;
    p.k = kc.data(); p.k_nb1 = (int64_t) rk*c.n_head_kv; p.k_nb2 = (int64_t) rk; p.k_nb3 = (int64_t) rk*c.n_head_kv*kv_size;
    p.v = vc.data(); p.v_nb1 = (int64_t) rv*c.n_head_kv; p.v_nb2 = (int64_t) rv; p.v_nb3 = (int64_t) rv*c.n_head_kv*kv_size;
    const size_t esz = c.mask_f16 ? 2 : 4;
    p.mask = c.mask_f16 ? (const char *) mask16.data() : (const char *) mask.data();
    p.m_ne2 = 1; p.m_ne3 = c.n_stream;
    p.mask_f16 = c.mask_f16;
    p.m_nb1 = (int64_t) c.n_kv*esz; p.m_nb2 = (int64_t) c.n_kv*c.ntok*esz; p.m_nb3 = p.m_nb2;
    p.sinks = c.sinks ? sinks.data() : nullptr;
    std::vector<float> dst((size_t) c.dv*c.ntok*c.n_head*c.n_stream, NAN);
    p.dst = dst.data();
    p.d_s1 = c.dv; p.d_s2 = (int64_t) c.dv*c.ntok; p.d_s3 = (int64_t) c.dv*c.ntok*c.n_head;
    if (c.tail) {
        p.d_s1 = (int64_t) c.dv*c.n_head; p.d_s2 = c.dv; p.d_s3 = (int64_t) c.dv*c.n_head*c.ntok;
    }
    p.out_rot = c.out_rot;
    const int walkers = attn_decode_walkers(c.tc);
    attn_decode_rows(p.rbk, (uintptr_t) p.k, p.k_nb1, p.k_nb2, p.k_nb3, walkers, p.uk, p.wk, p.rsk, p.gk);
    attn_decode_rows(p.rbv, (uintptr_t) p.v, p.v_nb1, p.v_nb2, p.v_nb3, walkers, p.uv, p.wv, p.rsv, p.gv);

    const int cg = attn_decode_cg(p.ncols);
    p.nbuf = c.nbuf;
    const size_t smem = c.tc ? attn_decode_tc_smem(p.dk, p.dv, p.rsk, p.rsv, p.nbuf)
                             : attn_decode_smem(p.ncols, p.dk, p.dv, p.rsk, p.rsv, p.nbuf, c.vmma);
    if (smem > EMU_LDS_LIMIT) {
        // ggml_cuda_attn_decode_fused_supported refuses it (the device's shared memory): the separate ops run
        printf("SKIP %s/%s dk=%d dv=%d ncols=%d: %zu bytes of shared memory, above the device's %zu\n", tname(c.tk),
               tname(c.tv), c.dk, c.dv, p.ncols, smem, EMU_LDS_LIMIT);
        return true;
    }
    // the combine folded into the kernel where the host folds it (attn_decode_fold_fits), on counts that start at 0 and
    // must be 0 again afterwards
    std::vector<unsigned> counts((size_t) c.n_stream*p.n_head_kv*p.ntiles, 0u);
    {
        const int    ncmax = c.tc ? AD_TC_COLS : AD_CT;
        const size_t room  = c.tc ? attn_decode_tc_fold_room(p.dk, p.dv) : attn_decode_fold_room(p.ncols, p.dk, p.dv);
        if (attn_decode_fold_fits(std::min(ncmax, p.ncols), p.dv, p.nsplit, room)) {
            p.fold = counts.data();
        }
    }
    std::unique_ptr<float[]>  part_o;
    std::unique_ptr<float2[]> part_ml;
    if (nsplit > 1) {
        const size_t nml = (size_t) c.n_stream*p.n_head_kv*nsplit*p.ncols;
        part_o.reset(new float[nml*p.dv]);
        part_ml.reset(new float2[nml]);
        std::fill(part_o.get(), part_o.get() + nml*p.dv, NAN);
        p.part_o = part_o.get(); p.part_ml = part_ml.get();
    }
    const bool f16 = c.mask_f16;
    auto kern = [&](auto tk, auto tv) {
        constexpr ggml_type TK = decltype(tk)::value, TV = decltype(tv)::value;
        auto run = [&](auto vm) {
            constexpr bool VM = decltype(vm)::value;
            launch(dim3((unsigned) nsplit, (unsigned) (p.n_head_kv*p.ntiles), (unsigned) c.n_stream), dim3(AD_NT), smem, [&] {
                if (cg == 1)      { if (f16) k_attn_decode<TK, TV, 1, half, VM>(p); else k_attn_decode<TK, TV, 1, float, VM>(p); }
                else if (cg == 4) { if (f16) k_attn_decode<TK, TV, 4, half, VM>(p); else k_attn_decode<TK, TV, 4, float, VM>(p); }
                else              { if (f16) k_attn_decode<TK, TV, 8, half, VM>(p); else k_attn_decode<TK, TV, 8, float, VM>(p); }
            });
        };
#if !defined(GGML_USE_HIP)
        if (c.tc) {
            auto tc = [&](auto dk, auto dv) {
                constexpr int DK = decltype(dk)::value, DV = decltype(dv)::value;
                launch(dim3((unsigned) nsplit, (unsigned) (p.n_head_kv*p.ntiles), (unsigned) c.n_stream), dim3(AD_NT), smem,
                       [&] { k_attn_decode_tc<TK, TV, DK, DV>(p); });
            };
            using i64 = std::integral_constant<int, 64>;
            using i128 = std::integral_constant<int, 128>;
            using i192 = std::integral_constant<int, 192>;
            if (c.dk == 128 && c.dv == 128) tc(i128{}, i128{});
            else if (c.dk == 192 && c.dv == 128) tc(i192{}, i128{});
            else if (c.dk == 64 && c.dv == 64) tc(i64{}, i64{});
            else { printf("FAIL: no tensor-core form for dk=%d dv=%d\n", c.dk, c.dv); std::exit(1); }
            return;
        }
#endif
        if (c.vmma) {
            run(std::true_type{});
        } else {
            run(std::false_type{});
        }
    };
    using q40 = std::integral_constant<ggml_type, GGML_TYPE_Q4_0>;
    using q41 = std::integral_constant<ggml_type, GGML_TYPE_Q4_1>;
    using q80 = std::integral_constant<ggml_type, GGML_TYPE_Q8_0>;
    auto kv = [&](auto tk) {
        if (c.tv == GGML_TYPE_Q4_0) kern(tk, q40{}); else if (c.tv == GGML_TYPE_Q4_1) kern(tk, q41{}); else kern(tk, q80{});
    };
    if (c.tk == GGML_TYPE_Q4_0) kv(q40{}); else if (c.tk == GGML_TYPE_Q4_1) kv(q41{}); else kv(q80{});
    if (nsplit > 1 && !p.fold) {
        launch(dim3((unsigned) p.ncols, (unsigned) p.n_head_kv, (unsigned) c.n_stream), dim3(AD_NT), attn_decode_combine_smem(p.nsplit, p.dv), [&] {
            k_attn_decode_combine(p.part_o, p.part_ml, p.sinks, p.dst, p.dv, p.ncols, p.ntok, p.gqa, p.n_head_kv, p.nsplit,
                                  p.d_s1, p.d_s2, p.d_s3, p.out_rot);
        });
    }

    // float64 reference (reference_queries, reference_row)
    const std::vector<double> qd = reference_queries(c, q);
    double num = 0, den = 0;
    bool finite = true;
    for (int s = 0; s < c.n_stream; ++s) for (int h = 0; h < c.n_head; ++h) for (int t = 0; t < c.ntok; ++t) {
        const std::vector<double> orow = reference_row(c, qd, kd, vd, mask, sinks, scale, kv_size, s, h, t);
        for (int i = 0; i < c.dv; ++i) {
            const double o = orow[i];
            const size_t di = c.tail ? (((size_t) s*c.ntok + t)*c.n_head + h)*c.dv + i
                                     : (((size_t) s*c.n_head + h)*c.ntok + t)*c.dv + i;
            const float got = dst[di];
            finite = finite && std::isfinite(got);
            num += (got - o)*(got - o);
            den += o*o;
        }
    }
    const double nmse = num/den;
    // f32 V*P: rounding only (<= 7e-14 seen); tensor-core V*P: V and P rounded to f16 once each (relative
    // 2^-11 at most), an error of its own kind, bounded separately
    const bool counts0 = std::all_of(counts.begin(), counts.end(), [](unsigned n) { return n == 0; });
#if defined(AD_EMULATE_CP_ASYNC)
    // every cp.async copy waited for (cuda_surface.h): one never waited for would be read, if at all, unsynchronized
    const size_t unwaited = g_cp_unwaited;
    g_cp_unwaited = 0;
#else
    const size_t unwaited = 0;
#endif
    const bool ok = finite && counts0 && unwaited == 0 && nmse < (c.vmma || c.tc ? 1e-6 : 1e-9);
    printf("%s %s/%s dk=%d dv=%d heads=%d/%d n_kv=%d ntok=%d streams=%d sinks=%d mask=%s rot=%d nsm=%d nbuf=%d tail=%d out_rot=%d vmma=%d tc=%d: nsplit=%d fold=%d cg=%d units=%d/%d windows=%d/%d unwaited=%zu nmse=%.3g\n",
           ok ? "OK  " : "FAIL", tname(c.tk), tname(c.tv), c.dk, c.dv, c.n_head, c.n_head_kv, c.n_kv, c.ntok, c.n_stream,
           (int) c.sinks, c.mask_f16 ? "f16" : "f32", c.n_rot, c.nsm, c.nbuf, (int) c.tail, c.out_rot, (int) c.vmma, (int) c.tc, (int) nsplit, (int) (p.fold != nullptr), cg,
           p.uk, p.uv, p.wk, p.wv, unwaited, nmse);
    return ok;
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // a line per case as it ends: the test's watchdog reads progress from it
    const attn_case cases[] = {
        // tk, tv, dk, dv, n_head, n_head_kv, n_kv, ntok, n_stream, sinks, mask_f16, n_rot, nsm, nbuf
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,   1, 1, 1, false, false,   0, 132, 1}, // 8B shape
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 127, 2, 1, true,  false,   0, 132, 1},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 128, 128, 32, 8, 700, 1, 1, true,  false,   0,  16, 2},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, 600, 8, 1, false, false,   0,  16, 2}, // 32 columns
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 900, 1, 1, true,  false,   0,  16, 2}, // MiMo full: GQA 16
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 192, 128, 64, 4, 300, 3, 1, true,  false,   0,  16, 1}, // 48 columns: 2 tiles
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 192, 128, 64, 8, 520, 8, 1, false, true,    0,  16, 2}, // MiMo SWA, 64 columns
        {GGML_TYPE_Q4_1, GGML_TYPE_Q4_1,  64,  64, 16, 4, 333, 3, 1, true,  false,   0,   8, 1}, // 12 columns, padded chunk
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 256, 256, 16, 2, 200, 4, 1, false, false,   0,   8, 2}, // 32 columns x d 256
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128,  8, 8, 260, 1, 1, false, false,   0,   8, 1}, // GQA 1: one column
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 400, 2, 2, true,  false,   0,  16, 2}, // 2 streams
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 300, 1, 1, true,  false, 128,  16, 2}, // rotated queries
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 192, 128, 64, 4, 200, 2, 1, false, true,   64,  16, 2},
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  90, 1, 1, true,  false,   0,   1, 1}, // one split
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, 1000, 1, 1, true, false,   0,   1, 2}, // one split of 16 tiles
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, 1000, 1, 1, true, false,   0,   1, 1}, // the same with one buffer
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0,  32,  32,  8, 2, 150, 2, 1, false, false,   0,   2, 1}, // 18-byte rows: 2-byte units
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, 256, 256,  8, 4, 200, 1, 2, true,  false,   0,   4, 2}, // 144/160-byte rows: 16-byte units
        // the permuted, contiguous output, and V's inverse rotation (one split: in ad_write_out; several: in the combine)
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  90, 1, 1, true,  false, 128,   1, 2, true,  64},
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 400, 2, 2, true,  false, 128,  16, 2, true,  64},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 300, 2, 1, true,  false,  64,  16, 1, true, 128},
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, 260, 3, 1, false, true,    0,   8, 2, true,   0},
        // V*P on tensor cores (d_v 128): 1 to 32 columns (1 to 4 n-tiles), tiles of 1 to 64 cells, every V type
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,   1, 1, 1, false, false,   0, 132, 2, false,  0, true}, // 8B shape
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 127, 2, 1, true,  false,   0, 132, 2, false,  0, true},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 128, 128, 32, 8, 700, 1, 1, true,  false,   0,  16, 2, false,  0, true},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, 600, 8, 1, false, false,   0,  16, 2, false,  0, true}, // 32 columns
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 900, 1, 1, true,  false,   0,  16, 2, false,  0, true}, // GQA 16
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 192, 128, 64, 8, 520, 8, 1, false, true,    0,  16, 1, false,  0, true}, // 64 columns
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128,  8, 8, 260, 1, 1, false, false,   0,   8, 2, false,  0, true}, // one column
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 400, 2, 2, true,  false, 128,  16, 2, true,  64, true}, // 2 streams, rotations
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, 1000, 1, 1, true, false,   0,   1, 2, false,  0, true}, // one split of 16 tiles
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,  90, 1, 1, true,  false, 128,   1, 2, true, 128, true}, // one split, 2 tiles
        // both products on tensor cores (k_attn_decode_tc): tiles of 16 columns, every K and V type, d 64/128/192
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 900, 1, 1, true,  false,   0,  16, 2, false,  0, false, true}, // MiMo full
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4,  97, 1, 1, true,  false,   0,  16, 2, false,  0, false, true}, // warps of 16/16/1/0 cells
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8,   1, 1, 1, false, false,   0, 132, 2, false,  0, false, true}, // 8B, 4 columns
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128, 32, 8, 127, 2, 1, true,  false,   0, 132, 2, false,  0, false, true},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 128, 128, 32, 8, 600, 8, 1, false, false,   0,  16, 2, false,  0, false, true}, // 32 columns: 2 tiles
        {GGML_TYPE_Q4_1, GGML_TYPE_Q4_0, 192, 128, 64, 8, 520, 3, 1, false, true,    0,  16, 2, false,  0, false, true}, // 24 columns, f16 mask
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 192, 128, 64, 4, 300, 2, 2, true,  false,  64,  16, 2, true,  64, false, true}, // 2 streams, rotations
        {GGML_TYPE_Q4_1, GGML_TYPE_Q4_1,  64,  64, 16, 4, 333, 3, 1, true,  false,   0,   8, 2, false,  0, false, true}, // 12 columns, d 64
        {GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, 192, 128, 64, 4, 1000, 1, 1, true, false,   0,   1, 2, true, 128, false, true}, // one split of 16 tiles
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128,  8, 8, 260, 1, 1, false, false,   0,   8, 2, false,  0, false, true}, // one column
    };
    bool all = true;
    int seed = 1;
    for (const attn_case & c : cases) {
        all = run_case(c, seed++) && all;
    }
    printf("%s\n", all ? "all passed" : "FAILED");
    return all ? 0 : 1;
}
