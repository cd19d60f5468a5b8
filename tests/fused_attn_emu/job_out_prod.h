// out-prod-q.cu: the quantized OUT_PROD's vector kernel k_out_prod_q_vec and, when the rows are
// split into chunks, k_out_prod_q_combine. src0 a quantized V cache viewed as [d_v, n_kv, n_head_kv, n_stream], src1
// the transposed softmax [n_tokens, n_kv, n_head, n_stream] (kq contiguous, read k-fastest), dst [d_v, n_tokens,
// n_head, n_stream]; planned as out_prod_q_cuda plans it (restated here) on nsm SMs/CUs, whatever the column count
// (the host's switch to the GEMM, 32 columns on HIP, 48/64 on NVIDIA, is not the kernel's). Reference: float64 sums of
// the decoded V rows times P. NMSE bound 1e-9: f32 rounding only.
#pragma once
#include OUTPROD_INC

#define OUT_PROD_MMA_ARGS vc.data(), kq.data(), out, c.dv, p.ne01, p.ne02, c.ntok, dps2, dps3, p.nb01, p.nb02, p.nb03, \
    p.s10, p.s12, p.s13, p.s1, p.s2, p.s3, p.nseg > 1 ? (int64_t) ne : 0, p.chunk_rows

struct out_prod_case {
    int dv, n_kv, n_head, n_head_kv, ntok, n_stream, nsm;
};

// a V cache of kv_size cells per stream: [n_stream][kv_size][n_head_kv] rows of dv values, random quantized blocks (vc)
// and their decoded values (vd); returns the bytes of a row
static size_t make_v_cache(std::mt19937 & g, const ggml_type type, const out_prod_case & c, const int kv_size,
        std::vector<char> & vc, std::vector<float> & vd) {
    const size_t rb    = qblock_bytes(type)*(c.dv/32);
    const size_t nrows = (size_t) c.n_head_kv*kv_size*c.n_stream;
    vc.resize(rb*nrows);
    vd.resize((size_t) c.dv*nrows);
    for (size_t r = 0; r < nrows; ++r) {
        make_qrow(g, type, c.dv, vc.data() + r*rb, vd.data() + r*c.dv);
    }
    return rb;
}

template <ggml_type type, int ncols>
static bool out_prod_run(const out_prod_case & c, const int seed) {
    const int dps2 = c.n_head/c.n_head_kv, dps3 = 1;
    const int total = c.ntok*dps2*dps3;
    const int want  = total <= 1 ? 1 : total <= 2 ? 2 : total <= 4 ? 4 : 8;
    if (want != ncols) {
        fprintf(stderr, "out_prod case does not match its instance (ncols %d)\n", want);
        abort();
    }
    std::mt19937 g(seed);
    const int kv_size = c.n_kv + 3;
    std::vector<char>  vc;
    std::vector<float> vd;
    const size_t rb = make_v_cache(g, type, c, kv_size, vc, vd);
    // P: kq [n_kv, n_tokens, n_head, n_stream] contiguous, softmax-like values
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> kq((size_t) c.n_kv*c.ntok*c.n_head*c.n_stream);
    for (auto & x : kq) x = u(g)*u(g);
    const size_t ne = (size_t) c.dv*c.ntok*c.n_head*c.n_stream;
    std::vector<float> dst(ne, NAN);

    // out_prod_q_cuda
    const int ne01 = c.n_kv, ne02 = c.n_head_kv, ne03 = c.n_stream;
    const int ntiles = (total + ncols - 1)/ncols;
    const int64_t nmat = (int64_t) ne02*ne03;
    int64_t nchunks = std::max<int64_t>(1, (4*c.nsm + nmat*ntiles - 1)/(nmat*ntiles));
    nchunks = std::min<int64_t>(nchunks, (ne01 + OUT_PROD_Q_MIN_ROWS - 1)/OUT_PROD_Q_MIN_ROWS);
    nchunks = std::max<int64_t>(nchunks, 1);
    const int64_t chunk_rows = (ne01 + nchunks - 1)/nchunks;
    nchunks = std::max<int64_t>(1, (ne01 + chunk_rows - 1)/chunk_rows);
    std::vector<float> tmp(nchunks > 1 ? nchunks*ne : 0, NAN);
    float * out = nchunks > 1 ? tmp.data() : dst.data();
    const int64_t nb01 = (int64_t) rb*c.n_head_kv, nb02 = (int64_t) rb, nb03 = (int64_t) rb*c.n_head_kv*kv_size;
    const int64_t s10 = c.n_kv, s11 = 1, s12 = (int64_t) c.n_kv*c.ntok, s13 = (int64_t) c.n_kv*c.ntok*c.n_head;
    const int64_t s1 = c.dv, s2 = (int64_t) c.dv*c.ntok, s3 = (int64_t) c.dv*c.ntok*c.n_head;
    launch(dim3((unsigned) nchunks, (unsigned) nmat, (unsigned) ntiles), dim3(OUT_PROD_Q_NTHREADS), 0, [&] {
        k_out_prod_q_vec<type, ncols>(vc.data(), kq.data(), out, c.dv, ne01, ne02, c.ntok, c.n_head, c.n_stream, dps2,
            dps3, nb01, nb02, nb03, s10, s11, s12, s13, s1, s2, s3, (int) chunk_rows);
    });
    if (nchunks > 1) {
        launch(dim3((unsigned) ((ne + 31)/32)), dim3(32*OUT_PROD_Q_COMBINE_LANES), 0, [&] {
            k_out_prod_q_combine(tmp.data(), dst.data(), (int64_t) ne, (int) nchunks);
        });
    }

    std::vector<double> ref(ne);
    for (int s = 0; s < c.n_stream; ++s) for (int h = 0; h < c.n_head; ++h) for (int t = 0; t < c.ntok; ++t) {
        for (int i = 0; i < c.dv; ++i) {
            double a = 0;
            for (int k = 0; k < c.n_kv; ++k) {
                a += (double) vd[(((size_t) s*kv_size + k)*c.n_head_kv + h/dps2)*c.dv + i] *
                     kq[k + t*s10 + h*s12 + s*s13];
            }
            ref[i + t*s1 + h*s2 + s*s3] = a;
        }
    }
    bool finite;
    const double e = nmse(ref, dst.data(), ne, &finite);
    const bool ok = finite && e < 1e-9;
    printf("%s out_prod %s dv=%d n_kv=%d heads=%d/%d ntok=%d streams=%d: cols=%d ncols=%d tiles=%d chunks=%d nmse=%.3g\n",
           ok ? "OK  " : "FAIL", qtype_name(type), c.dv, c.n_kv, c.n_head, c.n_head_kv, c.ntok, c.n_stream, total, ncols,
           ntiles, (int) nchunks, e);
    return ok;
}

// the tensor-core kernel's grid and strides for case c (out_prod_q_mma_plan_for): V rows rb bytes in a cache of kv_size
// cells per stream, kq's rows ld floats apart, dst contiguous
struct out_prod_mma_plan {
    int     ne01, ne02, chunk_rows;
    int64_t nmat, nz, nseg;
    int64_t nb01, nb02, nb03, s10, s12, s13, s1, s2, s3;
};

static out_prod_mma_plan out_prod_mma_plan_for(const out_prod_case & c, const size_t rb, const int kv_size, const int ld) {
    const int total = c.ntok*(c.n_head/c.n_head_kv);
    out_prod_mma_plan p;
    p.ne01 = c.n_kv;
    p.ne02 = c.n_head_kv;
    p.nmat = (int64_t) c.n_head_kv*c.n_stream;
    p.nz   = (c.dv/OUT_PROD_Q_MMA_M)*((total + OUT_PROD_Q_MMA_N - 1)/OUT_PROD_Q_MMA_N);
    p.chunk_rows = out_prod_q_mma_chunk_rows(p.ne01, p.nmat*p.nz, c.nsm);
    p.nseg = (p.ne01 + p.chunk_rows - 1)/p.chunk_rows;
    p.nb01 = (int64_t) rb*c.n_head_kv;
    p.nb02 = (int64_t) rb;
    p.nb03 = (int64_t) rb*c.n_head_kv*kv_size;
    p.s10  = ld;
    p.s12  = (int64_t) ld*c.ntok;
    p.s13  = (int64_t) ld*c.ntok*c.n_head;
    p.s1   = c.dv;
    p.s2   = (int64_t) c.dv*c.ntok;
    p.s3   = (int64_t) c.dv*c.ntok*c.n_head;
    return p;
}

// k_out_prod_q_mma (the CUDA surface: mma.sync and ldmatrix emulated as the PTX ISA gives them), planned as
// out_prod_q_mma_cuda plans it (out_prod_q_mma_chunk_rows, the kernel's own helper) on nsm SMs, with kq's rows ld >= n_kv
// floats apart (a multiple of 4, as the host requires). Reference: float64 sums of V and P each rounded to f16 as the
// kernel rounds them (V's decoded value, P's f32); NMSE bound 1e-9: f32 accumulation only.
static bool out_prod_mma_run(const ggml_type type, const out_prod_case & c, const int seed) {
    const int dps2 = c.n_head/c.n_head_kv, dps3 = 1;
    const int total = c.ntok*dps2*dps3;
    std::mt19937 g(seed);
    const int kv_size = c.n_kv + 3;
    std::vector<char>  vc;
    std::vector<float> vd;
    const size_t rb = make_v_cache(g, type, c, kv_size, vc, vd);
    const int ld = (c.n_kv + 3)/4*4;
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> kq((size_t) ld*c.ntok*c.n_head*c.n_stream, NAN); // the padding is never read
    for (int r = 0; r < c.ntok*c.n_head*c.n_stream; ++r) {
        for (int k = 0; k < c.n_kv; ++k) {
            kq[(size_t) r*ld + k] = u(g)*u(g);
        }
    }
    const size_t ne = (size_t) c.dv*c.ntok*c.n_head*c.n_stream;
    std::vector<float> dst(ne, NAN);

    // out_prod_q_mma_cuda
    const out_prod_mma_plan p = out_prod_mma_plan_for(c, rb, kv_size, ld);
    const int64_t nseg = p.nseg, s10 = p.s10, s12 = p.s12, s13 = p.s13, s1 = p.s1, s2 = p.s2, s3 = p.s3;
    std::vector<float> tmp(nseg > 1 ? nseg*ne : 0, NAN);
    float * out = nseg > 1 ? tmp.data() : dst.data();
    launch(dim3((unsigned) nseg, (unsigned) p.nmat, (unsigned) p.nz), dim3(OUT_PROD_Q_MMA_NT), 0, [&] {
        switch (type) {
            case GGML_TYPE_Q4_0:   k_out_prod_q_mma<GGML_TYPE_Q4_0>  (OUT_PROD_MMA_ARGS); break;
            case GGML_TYPE_Q4_1:   k_out_prod_q_mma<GGML_TYPE_Q4_1>  (OUT_PROD_MMA_ARGS); break;
            case GGML_TYPE_Q5_0:   k_out_prod_q_mma<GGML_TYPE_Q5_0>  (OUT_PROD_MMA_ARGS); break;
            case GGML_TYPE_Q5_1:   k_out_prod_q_mma<GGML_TYPE_Q5_1>  (OUT_PROD_MMA_ARGS); break;
            case GGML_TYPE_Q8_0:   k_out_prod_q_mma<GGML_TYPE_Q8_0>  (OUT_PROD_MMA_ARGS); break;
            case GGML_TYPE_IQ4_NL: k_out_prod_q_mma<GGML_TYPE_IQ4_NL>(OUT_PROD_MMA_ARGS); break;
            default: abort();
        }
    });
    if (nseg > 1) {
        launch(dim3((unsigned) ((ne + 31)/32)), dim3(32*OUT_PROD_Q_COMBINE_LANES), 0, [&] {
            k_out_prod_q_combine(tmp.data(), dst.data(), (int64_t) ne, (int) nseg);
        });
    }

    auto f16 = [](const float x) { return (double) (float) half(x); };
    std::vector<double> ref(ne);
    for (int s = 0; s < c.n_stream; ++s) for (int h = 0; h < c.n_head; ++h) for (int t = 0; t < c.ntok; ++t) {
        for (int i = 0; i < c.dv; ++i) {
            double a = 0;
            for (int k = 0; k < c.n_kv; ++k) {
                a += f16(vd[(((size_t) s*kv_size + k)*c.n_head_kv + h/dps2)*c.dv + i]) * f16(kq[k + t*s10 + h*s12 + s*s13]);
            }
            ref[i + t*s1 + h*s2 + s*s3] = a;
        }
    }
    bool finite;
    const double e = nmse(ref, dst.data(), ne, &finite);
    const bool ok = finite && e < 1e-9;
    printf("%s out_prod_mma %s dv=%d n_kv=%d heads=%d/%d ntok=%d streams=%d: cols=%d blocks=%d segments=%d rows=%d nmse=%.3g\n",
           ok ? "OK  " : "FAIL", qtype_name(type), c.dv, c.n_kv, c.n_head, c.n_head_kv, c.ntok, c.n_stream, total,
           (int) (p.nmat*p.nz), (int) nseg, p.chunk_rows, e);
    return ok;
}

// k_out_prod_q_mma<type, true> and k_out_prod_q_softmax_combine (out_prod_q_softmax_cuda): V*P with the softmax taken
// over, src1 the raw scores [n_kv (rows ld >= n_kv floats apart, a multiple of 4), n_tokens, n_head, n_stream], an f16
// mask [n_kv (rows ldm halves apart), n_tokens, 1, n_stream] of 0, -inf (a causal edge and scattered holes) and
// finite values, a scale and optional sinks. Reference: the softmax as ggml's CPU computes it (x = s*scale + mask, the
// max with the sink, the sum with the sink's exp), in float64, times V rounded to f16 as the kernel rounds it. NMSE
// bound 1e-6: the kernel rounds P (exp(x - the running max), before the division) to f16 once, 2^-11 relative.
static bool out_prod_softmax_run(const ggml_type type, const out_prod_case & c, const bool sinks, const int seed) {
    const int dps2 = c.n_head/c.n_head_kv, dps3 = 1;
    const int total = c.ntok*dps2*dps3;
    std::mt19937 g(seed);
    const int kv_size = c.n_kv + 3;
    std::vector<char>  vc;
    std::vector<float> vd;
    const size_t rb = make_v_cache(g, type, c, kv_size, vc, vd);
    const int ld  = (c.n_kv + 3)/4*4;
    const int ldm = (c.n_kv + 7)/4*4; // the mask's rows: padded past ld, as llama.cpp pads them
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::uniform_int_distribution<int> hole(0, 9);
    std::vector<float> kq((size_t) ld*c.ntok*c.n_head*c.n_stream, NAN); // the padding is never read
    for (int r = 0; r < c.ntok*c.n_head*c.n_stream; ++r) {
        for (int k = 0; k < c.n_kv; ++k) {
            kq[(size_t) r*ld + k] = nd(g);
        }
    }
    std::vector<half> mask((size_t) ldm*c.ntok*c.n_stream);
    for (int s = 0; s < c.n_stream; ++s) for (int t = 0; t < c.ntok; ++t) for (int k = 0; k < ldm; ++k) {
        const bool masked = k > c.n_kv - c.ntok + t || (k > 0 && hole(g) == 0); // cell 0 always attended
        mask[((size_t) s*c.ntok + t)*ldm + k] = half(masked ? -INFINITY : k % 7 == 3 ? -1.5f : 0.0f);
    }
    std::vector<float> sk(c.n_head);
    for (auto & x : sk) x = nd(g);
    const float scale = 0.125f;
    const size_t ne = (size_t) c.dv*c.ntok*c.n_head*c.n_stream;
    std::vector<float> dst(ne, NAN);

    // out_prod_q_softmax_cuda
    const out_prod_mma_plan p = out_prod_mma_plan_for(c, rb, kv_size, ld);
    const int64_t nseg = p.nseg, s10 = p.s10, s12 = p.s12, s13 = p.s13, s1 = p.s1, s2 = p.s2, s3 = p.s3;
    const int64_t ncols_all = (int64_t) c.ntok*c.n_head*c.n_stream;
    std::vector<float> tmp(nseg*ne + 2*nseg*ncols_all, NAN);
    out_prod_q_softmax_args sm;
    sm.mask = mask.data();
    sm.mnb1 = ldm;
    sm.mnb2 = (int64_t) ldm*c.ntok;
    sm.mnb3 = (int64_t) ldm*c.ntok;
    sm.mne2 = 1;
    sm.mne3 = c.n_stream;
    sm.ns1  = c.ntok;
    sm.ns2  = c.n_head;
    sm.srow = ld;
    sm.scale = scale;
    sm.ml   = tmp.data() + nseg*ne;
    launch(dim3((unsigned) nseg, (unsigned) p.nmat, (unsigned) p.nz), dim3(OUT_PROD_Q_MMA_NT), 0, [&] {
#define OUT_PROD_SOFTMAX_ARGS vc.data(), kq.data(), tmp.data(), c.dv, p.ne01, p.ne02, c.ntok, dps2, dps3, p.nb01, p.nb02, \
    p.nb03, p.s10, p.s12, p.s13, p.s1, p.s2, p.s3, (int64_t) ne, p.chunk_rows, sm
        switch (type) {
            case GGML_TYPE_Q4_0:   k_out_prod_q_mma<GGML_TYPE_Q4_0,   true>(OUT_PROD_SOFTMAX_ARGS); break;
            case GGML_TYPE_Q4_1:   k_out_prod_q_mma<GGML_TYPE_Q4_1,   true>(OUT_PROD_SOFTMAX_ARGS); break;
            case GGML_TYPE_Q5_0:   k_out_prod_q_mma<GGML_TYPE_Q5_0,   true>(OUT_PROD_SOFTMAX_ARGS); break;
            case GGML_TYPE_Q5_1:   k_out_prod_q_mma<GGML_TYPE_Q5_1,   true>(OUT_PROD_SOFTMAX_ARGS); break;
            case GGML_TYPE_Q8_0:   k_out_prod_q_mma<GGML_TYPE_Q8_0,   true>(OUT_PROD_SOFTMAX_ARGS); break;
            case GGML_TYPE_IQ4_NL: k_out_prod_q_mma<GGML_TYPE_IQ4_NL, true>(OUT_PROD_SOFTMAX_ARGS); break;
            default: abort();
        }
#undef OUT_PROD_SOFTMAX_ARGS
    });
    launch(dim3((unsigned) ((ne + 255)/256)), dim3(256), 0, [&] {
        k_out_prod_q_softmax_combine(tmp.data(), sm.ml, sinks ? sk.data() : nullptr, dst.data(), (int64_t) ne, c.dv,
            ncols_all, (int) nseg, c.ntok, c.n_head, s10, s12, s13, ld, c.ntok, c.n_head);
    });

    auto f16 = [](const float x) { return (double) (float) half(x); };
    std::vector<double> ref(ne);
    std::vector<double> pr(c.n_kv); // P of one row
    for (int s = 0; s < c.n_stream; ++s) for (int h = 0; h < c.n_head; ++h) for (int t = 0; t < c.ntok; ++t) {
        double mx = sinks ? (double) sk[h] : -INFINITY;
        for (int k = 0; k < c.n_kv; ++k) {
            const float x = kq[k + t*s10 + h*s12 + s*s13]*scale + (float) mask[((size_t) s*c.ntok + t)*ldm + k];
            pr[k] = x;
            mx = std::max(mx, (double) x);
        }
        double sum = sinks ? std::exp((double) sk[h] - mx) : 0.0;
        for (int k = 0; k < c.n_kv; ++k) {
            pr[k] = std::exp(pr[k] - mx);
            sum += pr[k];
        }
        for (int i = 0; i < c.dv; ++i) {
            double a = 0;
            for (int k = 0; k < c.n_kv; ++k) {
                a += f16(vd[(((size_t) s*kv_size + k)*c.n_head_kv + h/dps2)*c.dv + i]) * pr[k];
            }
            ref[i + t*s1 + h*s2 + s*s3] = a/sum;
        }
    }
    bool finite;
    const double e = nmse(ref, dst.data(), ne, &finite);
    const bool ok = finite && e < 1e-6;
    printf("%s out_prod_softmax %s dv=%d n_kv=%d heads=%d/%d ntok=%d streams=%d sinks=%d: cols=%d blocks=%d segments=%d rows=%d nmse=%.3g\n",
           ok ? "OK  " : "FAIL", qtype_name(type), c.dv, c.n_kv, c.n_head, c.n_head_kv, c.ntok, c.n_stream, (int) sinks,
           total, (int) (p.nmat*p.nz), (int) nseg, p.chunk_rows, e);
    return ok;
}

// k_out_prod_q_softmax_f16 (out_prod_q_softmax_gemm_cuda): the split's chunk softmax written as the f16 P of the F16 GEMM
// path, on both surfaces. Raw scores [n_kv, ntok, n_head, n_stream] contiguous; an f16 mask [n_kv (rows ldm halves
// apart), ntok, 1, n_stream] of 0, -inf (a causal edge, scattered holes and, with empty_row, one row masked whole) and
// finite values, or none; a scale; optional sinks. Reference: the softmax as ggml's CPU computes it, in float64. NMSE
// bound 1e-6 (P rounded to f16 once, 2^-11 relative); a masked cell's P, and every P of a row masked whole without a
// sink, exactly 0.
static bool softmax_f16_run(const int n_kv, const int ntok, const int n_head, const int n_stream, const bool with_mask,
        const bool sinks, const bool empty_row, const int seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::uniform_int_distribution<int> hole(0, 9);
    const int64_t nrows = (int64_t) ntok*n_head*n_stream;
    std::vector<float> x((size_t) nrows*n_kv);
    for (auto & v : x) v = nd(g);
    const int ldm = (n_kv + 7)/4*4;
    std::vector<half> mask((size_t) ldm*ntok*n_stream);
    for (int s = 0; s < n_stream; ++s) for (int t = 0; t < ntok; ++t) for (int k = 0; k < ldm; ++k) {
        const bool whole = empty_row && s == n_stream - 1 && t == ntok/2;
        const bool masked = whole || k > n_kv - ntok + t || (k > 0 && hole(g) == 0);
        mask[((size_t) s*ntok + t)*ldm + k] = half(masked ? -INFINITY : k % 7 == 3 ? -1.5f : 0.0f);
    }
    std::vector<float> sk(n_head);
    for (auto & v : sk) v = nd(g);
    const float scale = 0.0883883f;

    out_prod_q_softmax_args sm;
    sm.mask = with_mask ? mask.data() : nullptr;
    sm.mnb1 = ldm;
    sm.mnb2 = (int64_t) ldm*ntok;
    sm.mnb3 = (int64_t) ldm*ntok;
    sm.mne2 = 1;
    sm.mne3 = n_stream;
    sm.ns1  = ntok;
    sm.ns2  = n_head;
    sm.srow = n_kv;
    sm.scale = scale;
    sm.ml   = nullptr;
    std::vector<half> p((size_t) nrows*n_kv, half(NAN));
    launch(dim3((unsigned) nrows), dim3(OUT_PROD_Q_SOFTMAX_NT), 0, [&] {
        k_out_prod_q_softmax_f16(x.data(), sinks ? sk.data() : nullptr, p.data(), n_kv, sm);
    });

    std::vector<double> ref((size_t) nrows*n_kv);
    std::vector<float> got((size_t) nrows*n_kv);
    bool zeros = true;
    for (int64_t r = 0; r < nrows; ++r) {
        const int t = (int) (r % ntok), h = (int) ((r/ntok) % n_head), s = (int) (r/((int64_t) ntok*n_head));
        const half * mr = mask.data() + ((size_t) s*ntok + t)*ldm;
        double mx = sinks ? (double) sk[h] : -INFINITY;
        for (int k = 0; k < n_kv; ++k) {
            const double v = (double) x[r*n_kv + k]*scale + (with_mask ? (double) (float) mr[k] : 0.0);
            ref[r*n_kv + k] = v;
            mx = std::max(mx, v);
        }
        double sum = sinks ? std::exp((double) sk[h] - mx) : 0.0;
        for (int k = 0; k < n_kv; ++k) {
            ref[r*n_kv + k] = mx == -INFINITY ? 0.0 : std::exp(ref[r*n_kv + k] - mx);
            sum += ref[r*n_kv + k];
        }
        for (int k = 0; k < n_kv; ++k) {
            ref[r*n_kv + k] = sum > 0 ? ref[r*n_kv + k]/sum : 0.0;
            got[r*n_kv + k] = (float) p[r*n_kv + k];
            if ((ref[r*n_kv + k] == 0.0 || (with_mask && (float) mr[k] == -INFINITY)) && got[r*n_kv + k] != 0.0f) {
                zeros = false;
            }
        }
    }
    bool finite;
    const double e = nmse(ref, got.data(), got.size(), &finite);
    const bool ok = finite && zeros && e < 1e-6;
    printf("%s softmax_to_f16 n_kv=%d rows=%lld (ntok %d x heads %d x streams %d) mask=%d sinks=%d empty_row=%d: zeros=%d nmse=%.3g\n",
           ok ? "OK  " : "FAIL", n_kv, (long long) nrows, ntok, n_head, n_stream, (int) with_mask, (int) sinks,
           (int) empty_row, (int) zeros, e);
    return ok;
}

static bool run_out_prod() {
    bool all = true;
    const int seed = 200;
    // dv, n_kv, n_head, n_head_kv, ntok, n_stream, nsm
    EMU_CASE(out_prod_run<GGML_TYPE_Q4_0,   4>({128,    1, 32, 8,  1, 1, 104}, seed + g_emu_case)); // 8B: GQA 4
    EMU_CASE(out_prod_run<GGML_TYPE_Q4_0,   8>({128, 1001, 32, 8,  3, 1, 104}, seed + g_emu_case)); // 12 columns, chunks
    EMU_CASE(out_prod_run<GGML_TYPE_Q4_1,   8>({128,  300, 32, 8, 16, 1, 104}, seed + g_emu_case)); // 64 columns
    EMU_CASE(out_prod_run<GGML_TYPE_Q8_0,   4>({128, 4099, 32, 8,  1, 1, 132}, seed + g_emu_case)); // many chunks
    EMU_CASE(out_prod_run<GGML_TYPE_Q5_0,   4>({ 64,  333,  9, 3,  1, 2, 104}, seed + g_emu_case)); // SmolLM2: GQA 3, 2 streams
    EMU_CASE(out_prod_run<GGML_TYPE_Q5_1,   8>({ 64,  129,  9, 3,  2, 1,   8}, seed + g_emu_case));
    EMU_CASE(out_prod_run<GGML_TYPE_IQ4_NL, 8>({ 64,   77,  9, 3, 11, 1, 104}, seed + g_emu_case)); // 33 columns
    EMU_CASE(out_prod_run<GGML_TYPE_Q8_0,   8>({128,  901, 64, 8,  1, 1, 104}, seed + g_emu_case)); // MiMo V 128 at GQA 8
    EMU_CASE(out_prod_run<GGML_TYPE_Q4_0,   8>({128,  513, 64, 4,  2, 1, 104}, seed + g_emu_case)); // GQA 16: 32 columns
    EMU_CASE(out_prod_run<GGML_TYPE_Q4_1,   1>({192,  250,  4, 4,  1, 1, 104}, seed + g_emu_case)); // 24 threads per row
    EMU_CASE(out_prod_run<GGML_TYPE_Q8_0,   2>({512,  130,  4, 2,  1, 1, 104}, seed + g_emu_case));
    EMU_CASE(out_prod_run<GGML_TYPE_Q4_0,   4>({1024,  65,  4, 1,  1, 1, 104}, seed + g_emu_case)); // 128 threads per row
    // the split's chunk softmax as the F16 GEMM path's f16 P (k_out_prod_q_softmax_f16), both surfaces: MiMo's chunk at
    // GQA 16 with sinks, rows shorter than the block, two streams with a row masked whole, no mask, both without sinks
    EMU_CASE(softmax_f16_run(3001, 16,  8, 1, true,  true,  false, seed + g_emu_case));
    EMU_CASE(softmax_f16_run( 100,  5,  3, 1, true,  true,  false, seed + g_emu_case));
    EMU_CASE(softmax_f16_run( 777,  9,  4, 2, true,  false, true,  seed + g_emu_case));
    EMU_CASE(softmax_f16_run( 513,  4,  2, 1, false, false, false, seed + g_emu_case));
#if defined(OUT_PROD_Q_MMA_CODE)
    // the tensor-core kernel (NVIDIA only: the HIP surface has no mma.sync): the split attention's chunk at GQA 16
    // (cols 256, k segments), a partial column tile and a k tail, two row blocks of d_v and two streams, one segment
    // writing dst in place
    EMU_CASE(out_prod_mma_run(GGML_TYPE_Q4_1,   {128,  520, 64, 4, 16, 1,   8}, seed + g_emu_case)); // 2 x 128 columns
    EMU_CASE(out_prod_mma_run(GGML_TYPE_Q8_0,   {128,  777, 16, 1,  9, 1,  16}, seed + g_emu_case)); // 144: 128 + 16
    EMU_CASE(out_prod_mma_run(GGML_TYPE_Q4_0,   {256,  300,  8, 2,  8, 2,   4}, seed + g_emu_case)); // d_v 256, 2 streams
    EMU_CASE(out_prod_mma_run(GGML_TYPE_Q5_0,   {128,  513,  4, 4, 70, 1, 132}, seed + g_emu_case)); // GQA 1, 70 columns
    EMU_CASE(out_prod_mma_run(GGML_TYPE_Q5_1,   {128,  200, 12, 3,  3, 1,   1}, seed + g_emu_case)); // one segment
    EMU_CASE(out_prod_mma_run(GGML_TYPE_IQ4_NL, {128,   33, 32, 8,  5, 1, 104}, seed + g_emu_case)); // 33 cells
    // its softmax form (the split's chunk with the softmax taken over): MiMo's chunk at GQA 16 with sinks over k
    // segments, a partial column tile and a k tail without sinks, d_v 256 and two streams, one segment
    EMU_CASE(out_prod_softmax_run(GGML_TYPE_Q4_1, {128,  520, 64, 4, 16, 1,   8}, true,  seed + g_emu_case));
    EMU_CASE(out_prod_softmax_run(GGML_TYPE_Q8_0, {128,  777, 16, 1,  9, 1,  16}, false, seed + g_emu_case));
    EMU_CASE(out_prod_softmax_run(GGML_TYPE_Q4_0, {256,  301,  8, 2,  8, 2,   4}, true,  seed + g_emu_case));
    EMU_CASE(out_prod_softmax_run(GGML_TYPE_Q5_1, {128,  200, 12, 3,  3, 1,   1}, true,  seed + g_emu_case));
#endif // defined(OUT_PROD_Q_MMA_CODE)
    return all;
}
