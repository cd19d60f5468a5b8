// out-prod-q.cu: the quantized OUT_PROD's vector kernel k_out_prod_q_vec and, when the rows are
// split into chunks, k_out_prod_q_combine. src0 a quantized V cache viewed as [d_v, n_kv, n_head_kv, n_stream], src1
// the transposed softmax [n_tokens, n_kv, n_head, n_stream] (kq contiguous, read k-fastest), dst [d_v, n_tokens,
// n_head, n_stream]; planned as out_prod_q_cuda plans it (restated here) on nsm SMs/CUs, whatever the column count
// (the host's switch to the GEMM, 32 columns on HIP, 48/64 on NVIDIA, is not the kernel's). Reference: float64 sums of
// the decoded V rows times P. NMSE bound 1e-9: f32 rounding only.
#pragma once
#include OUTPROD_INC

struct out_prod_case {
    int dv, n_kv, n_head, n_head_kv, ntok, n_stream, nsm;
};

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
    const size_t rb = qblock_bytes(type)*(c.dv/32);
    std::vector<char>  vc(rb*c.n_head_kv*kv_size*c.n_stream);
    std::vector<float> vd((size_t) c.dv*c.n_head_kv*kv_size*c.n_stream);
    for (size_t r = 0; r < (size_t) c.n_head_kv*kv_size*c.n_stream; ++r) {
        make_qrow(g, type, c.dv, vc.data() + r*rb, vd.data() + r*c.dv);
    }
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
    return all;
}
