// fwht-fused.cu: the rotation fusions. k_fwht_set_rows stores every N-segment of a K/V row
// Hadamard-rotated and quantized into the cache row its set_rows index names (ROPE: K's rope applied first,
// read from the rope's strided source); k_cont_fwht rotates the segments of a permuted F32 source into a contiguous
// output. A block is FWHT_FUSED_ROWS warps of the device's warp size, one segment each, as the host launches them
// (restated here). References in float64: the rope (ggml's formula with its YaRN ramp), then the Walsh-Hadamard matrix
// of N over sqrt(N).
// Bounds: CONT: 1e-9 (f32 butterflies: rounding only). SET_ROWS: the stored blocks, decoded, against the float64
// rotation, at most 1.05x the error of the same upstream quantizer (cpy-utils.cuh) applied to the float64 values
// rounded to f32 (the kernel's input differs from those by f32 rounding only, which moves a few values across a
// rounding boundary: a fraction of a percent of the quantization error), and every cache row no index names untouched.
#pragma once
#include FWHT_PARAMS_INC
#include FWHT_INC

struct fwht_case {
    int dk, n_head_kv, ntok, N;
    bool rope, neox;
    int n_dims, n_offs;
    bool freq_factors;
    float ext_factor;
};

static void rope_ref(const fwht_rope_params & rp, const float * x, const float * ff, const int pos, double * out) {
    for (int i0 = 0; i0 < rp.ne0; ++i0) {
        const int iw = i0 - rp.n_offs;
        if (iw < 0 || iw >= rp.n_dims) {
            out[i0] = x[i0];
            continue;
        }
        const int half = rp.n_dims/2;
        const int p    = rp.neox ? (iw < half ? iw : iw - half) : iw/2;
        const int i_lo = rp.neox ? rp.n_offs + p : rp.n_offs + 2*p;
        const int i_hi = rp.neox ? i_lo + half : i_lo + 1;
        const double theta_extra = pos*std::pow((double) rp.theta_scale, (double) p) / (ff ? ff[p] : 1.0);
        double theta  = rp.freq_scale*theta_extra;
        double mscale = rp.attn_factor;
        if (rp.ext_factor != 0.0f) {
            const double y    = (p - rp.corr_low)/std::max(0.001, (double) rp.corr_high - rp.corr_low);
            const double ramp = (1.0 - std::min(1.0, std::max(0.0, y)))*rp.ext_factor;
            theta   = theta*(1.0 - ramp) + theta_extra*ramp;
            mscale *= 1.0 + 0.1*std::log(1.0/rp.freq_scale);
        }
        const double x0 = x[i_lo], x1 = x[i_hi];
        out[i0] = (i0 == i_lo ? x0*std::cos(theta) - x1*std::sin(theta) : x0*std::sin(theta) + x1*std::cos(theta))*mscale;
    }
}

template <ggml_type type> struct emu_quantizer;
#define EMU_QUANTIZER(T, BLOCK, QK, FN) \
    template <> struct emu_quantizer<T> { using block = BLOCK; static constexpr int qk = QK; \
        static constexpr void (*fn)(const float *, BLOCK *) = FN; }
EMU_QUANTIZER(GGML_TYPE_Q4_0,   block_q4_0,   QK4_0,  quantize_f32_q4_0_block);
EMU_QUANTIZER(GGML_TYPE_Q4_1,   block_q4_1,   QK4_1,  quantize_f32_q4_1_block);
EMU_QUANTIZER(GGML_TYPE_Q5_0,   block_q5_0,   QK5_0,  quantize_f32_q5_0_block);
EMU_QUANTIZER(GGML_TYPE_Q5_1,   block_q5_1,   QK5_1,  quantize_f32_q5_1_block);
EMU_QUANTIZER(GGML_TYPE_Q8_0,   block_q8_0,   QK8_0,  quantize_f32_q8_0_block);
EMU_QUANTIZER(GGML_TYPE_IQ4_NL, block_iq4_nl, QK4_NL, quantize_f32_iq4_nl_block);
#undef EMU_QUANTIZER

// K rows [dk, n_head_kv] of ntok tokens into cache rows idx[t] of [dk*n_head_kv] values
template <ggml_type type, int N, bool ROPE>
static bool fwht_set_rows_run(const fwht_case & c, const int seed) {
    using block = typename emu_quantizer<type>::block;
    constexpr int qk = emu_quantizer<type>::qk;
    std::mt19937 g(seed);
    const int ne00 = c.dk*c.n_head_kv;
    const int kv_size = c.ntok + 7;
    const size_t rb = qblock_bytes(type)*(ne00/32);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    // the rope's source: a fused QKV-like buffer, K's heads strided by dk, its tokens by (n_head_kv + 3)*dk
    const int64_t tok_stride = (int64_t) (c.n_head_kv + 3)*c.dk;
    std::vector<float> src((size_t) tok_stride*c.ntok);
    for (auto & x : src) x = u(g);
    std::vector<float> ff(std::max(1, c.n_dims/2));
    for (auto & x : ff) x = 1.0f + 3.0f*u(g)*u(g);
    std::vector<int32_t> pos(c.ntok);
    for (int t = 0; t < c.ntok; ++t) pos[t] = 17 + 29*t;
    // the data a plain (not ROPE) set_rows stores: contiguous [ne00, ntok]
    std::vector<float> x((size_t) ne00*c.ntok);
    for (int t = 0; t < c.ntok; ++t) for (int i = 0; i < ne00; ++i) x[(size_t) t*ne00 + i] = src[t*tok_stride + i];
    std::vector<int64_t> idx(c.ntok);
    for (int t = 0; t < c.ntok; ++t) idx[t] = kv_size - 1 - 2*t; // distinct, backwards (ntok < 7)
    std::vector<char> cache(rb*kv_size, (char) 0x5A), cache0;
    cache0 = cache;

    fwht_rope_params rp = {};
    if (c.rope) {
        rp.src = (const char *) src.data();
        rp.pos = pos.data();
        rp.freq_factors = c.freq_factors ? ff.data() : nullptr;
        rp.ne0 = c.dk; rp.ne1 = c.n_head_kv; rp.ne2 = c.ntok;
        rp.nb1 = (int64_t) c.dk*4; rp.nb2 = tok_stride*4; rp.nb3 = tok_stride*4*c.ntok;
        rp.n_dims = c.n_dims; rp.n_offs = c.n_offs; rp.neox = c.neox;
        rp.theta_scale = powf(10000.0f, -2.0f/c.n_dims);
        rp.freq_scale  = c.ext_factor != 0.0f ? 0.25f : 1.0f;
        rp.ext_factor  = c.ext_factor;
        rp.attn_factor = 1.0f;
        rp.corr_low = 4.0f; rp.corr_high = 21.0f;
    }
    // fwht_set_rows_launch (ne01 = ntok rows of ne00, ne02 = 1; idx [ntok] i64)
    const int64_t nseg = (int64_t) ne00*c.ntok/N;
    const dim3 grid((unsigned) ((nseg + FWHT_FUSED_ROWS - 1)/FWHT_FUSED_ROWS)), blk(EMU_WARP, FWHT_FUSED_ROWS);
    const int64_t nb1 = (int64_t) rb, nb2 = (int64_t) rb*kv_size, nb3 = nb2;
    const float scale = 1.0f/sqrtf((float) N);
    if (c.rope != ROPE) {
        abort();
    }
    launch(grid, blk, 0, [&] {
        k_fwht_set_rows<N, int64_t, block, qk, emu_quantizer<type>::fn, ROPE>(ROPE ? nullptr : x.data(), idx.data(),
            cache.data(), nseg, ne00, c.ntok, 1, 1, 1, 1, c.ntok, c.ntok, nb1, nb2, nb3, scale, rp);
    });

    // float64: the rope's output (or x), rotated per segment; the reference store: the same quantizer on its f32 values
    std::vector<double> ref((size_t) ne00*c.ntok);
    for (int t = 0; t < c.ntok; ++t) for (int h = 0; h < c.n_head_kv; ++h) {
        double * o = ref.data() + (size_t) t*ne00 + (size_t) h*c.dk;
        if (c.rope) {
            rope_ref(rp, src.data() + t*tok_stride + h*c.dk, rp.freq_factors, pos[t], o);
        } else {
            for (int i = 0; i < c.dk; ++i) o[i] = x[(size_t) t*ne00 + h*c.dk + i];
        }
    }
    hadamard_ref(ref, N);
    std::vector<float> rf(ref.begin(), ref.end());
    std::vector<float> got(ref.size()), refq(ref.size());
    std::vector<char> qrow(rb);
    bool others_untouched = true;
    for (int r = 0; r < kv_size; ++r) {
        int t = -1;
        for (int tt = 0; tt < c.ntok; ++tt) if (idx[tt] == r) t = tt;
        if (t < 0) {
            others_untouched = others_untouched && std::memcmp(cache.data() + r*rb, cache0.data() + r*rb, rb) == 0;
            continue;
        }
        decode_row(type, cache.data() + r*rb, ne00, got.data() + (size_t) t*ne00);
        for (int b = 0; b < ne00/qk; ++b) {
            emu_quantizer<type>::fn(rf.data() + (size_t) t*ne00 + b*qk, (block *) qrow.data() + b);
        }
        decode_row(type, qrow.data(), ne00, refq.data() + (size_t) t*ne00);
    }
    bool finite, finite_ref;
    const double e  = nmse(ref, got.data(), got.size(), &finite);
    const double eq = nmse(ref, refq.data(), refq.size(), &finite_ref);
    const bool ok = finite && others_untouched && e <= 1.05*eq + 1e-12;
    printf("%s fwht_set_rows %s N=%d dk=%d heads_kv=%d ntok=%d rope=%d%s n_dims=%d n_offs=%d ff=%d ext=%g: segs=%d nmse=%.4g (quantizer on float64: %.4g)%s\n",
           ok ? "OK  " : "FAIL", qtype_name(type), N, c.dk, c.n_head_kv, c.ntok, (int) c.rope, c.neox ? " neox" : "",
           c.n_dims, c.n_offs, (int) c.freq_factors, c.ext_factor, (int) nseg, e, eq,
           others_untouched ? "" : " OTHER ROWS WRITTEN");
    return ok;
}

// CONT -> fwht: src [dv, n_head, ntok] a permuted view of [dv, ntok, n_head], output [dv*n_head*ntok] contiguous
template <int N>
static bool cont_fwht_run(const int dv, const int n_head, const int ntok, const int seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> src((size_t) dv*ntok*n_head);
    for (auto & x : src) x = u(g);
    const int64_t nseg = (int64_t) dv*n_head*ntok/N;
    std::vector<float> out((size_t) nseg*N, NAN);
    const int64_t nb01 = (int64_t) dv*ntok*4, nb02 = (int64_t) dv*4, nb03 = (int64_t) dv*ntok*n_head*4;
    const dim3 grid((unsigned) ((nseg + FWHT_FUSED_ROWS - 1)/FWHT_FUSED_ROWS)), blk(EMU_WARP, FWHT_FUSED_ROWS);
    launch(grid, blk, 0, [&] {
        k_cont_fwht<N>((const char *) src.data(), out.data(), nseg, dv, n_head, ntok, nb01, nb02, nb03, 1.0f/sqrtf((float) N));
    });
    std::vector<double> ref(out.size());
    for (int t = 0; t < ntok; ++t) for (int h = 0; h < n_head; ++h) for (int i = 0; i < dv; ++i) {
        ref[((size_t) t*n_head + h)*dv + i] = src[((size_t) h*ntok + t)*dv + i];
    }
    hadamard_ref(ref, N);
    bool finite;
    const double e = nmse(ref, out.data(), out.size(), &finite);
    const bool ok = finite && e < 1e-9;
    printf("%s cont_fwht N=%d dv=%d heads=%d ntok=%d: segs=%d nmse=%.3g\n", ok ? "OK  " : "FAIL", N, dv, n_head, ntok,
           (int) nseg, e);
    return ok;
}

static bool run_fwht_fused() {
    bool all = true;
    const int seed = 300;
    // dk, n_head_kv, ntok, N, rope, neox, n_dims, n_offs, freq_factors, ext_factor
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q4_0, 128, false>({128, 8, 3, 128, false, false,   0,  0, false, 0.0f}, seed + g_emu_case)); // 8B V
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q4_0, 128, true >({128, 8, 2, 128, true,  false, 128,  0, false, 0.0f}, seed + g_emu_case)); // 8B K: rope
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q8_0, 128, true >({128, 8, 1, 128, true,  true,  128,  0, true,  1.0f}, seed + g_emu_case)); // NEOX, YaRN
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q4_1,  64, true >({ 64, 3, 5,  64, true,  false,  64,  0, false, 0.0f}, seed + g_emu_case)); // SmolLM2
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q5_0,  64, false>({ 64, 3, 2,  64, false, false,   0,  0, false, 0.0f}, seed + g_emu_case));
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q5_1,  64, true >({192, 4, 2,  64, true,  false, 192,  0, false, 0.0f}, seed + g_emu_case)); // MiMo K 192
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_IQ4_NL,  64, true >({192, 2, 3,  64, true,  true,   64, 64, true,  0.0f}, seed + g_emu_case)); // partial NEOX
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q8_0, 256, false>({256, 2, 2, 256, false, false,   0,  0, false, 0.0f}, seed + g_emu_case));
    EMU_CASE(fwht_set_rows_run<GGML_TYPE_Q4_0, 512, true >({512, 1, 2, 512, true,  true,  512,  0, false, 0.0f}, seed + g_emu_case));
    EMU_CASE(cont_fwht_run< 64>(128, 32, 1, seed + g_emu_case));
    EMU_CASE(cont_fwht_run<128>(128, 32, 3, seed + g_emu_case));
    EMU_CASE(cont_fwht_run<128>(128, 64, 1, seed + g_emu_case)); // MiMo V 128 at 64 heads
    EMU_CASE(cont_fwht_run< 64>( 64,  9, 2, seed + g_emu_case)); // SmolLM2
    EMU_CASE(cont_fwht_run<256>(256,  4, 5, seed + g_emu_case));
    EMU_CASE(cont_fwht_run<512>(512,  2, 1, seed + g_emu_case));
    return all;
}
