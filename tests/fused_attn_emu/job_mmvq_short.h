// mmvq-short.cu: the short-row K*Q, mul_mat_vec_q_short, plain and with the queries' Hadamard rotation
// folded in (the FWHT_KQ fusion). src0 a quantized K cache viewed as [d_k, n_kv, n_head_kv, n_stream], src1 the queries
// [d_k, n_tokens, n_head, n_stream] (a permuted view), dst [n_kv, n_tokens, n_head, n_stream]; the launch planned as
// mul_mat_vec_q_short_launch plans it (restated here), on a device of nsm SMs/CUs. Reference: float64 dot products of
// the decoded blocks with the queries (rotated in float64 by the Hadamard matrix when rot > 0). NMSE bound 1e-9: the
// kernel's result differs from it by f32 rounding only (<= 1024-term sums and <= 10 butterflies: ~1e-12 expected).
#pragma once
#include MMVQ_INC

struct mmvq_case {
    int dk, n_kv, n_head, n_head_kv, ntok, n_stream, rot, nsm;
};

static int mmvq_tpr(const int dk) { // mul_mat_vec_q_short_switch_tpr
    const int nslots = dk/8;
    return nslots % 32 == 0 ? 32 : nslots % 16 == 0 ? 16 : nslots % 8 == 0 ? 8 : 4;
}

static int mmvq_ncols(const int total) { // mul_mat_vec_q_short_switch_ncols
    return total <= 1 ? 1 : total <= 2 ? 2 : total <= 4 ? 4 : 8;
}

template <ggml_type type, int ncols, int tpr>
static bool mmvq_run(const mmvq_case & c, const int seed) {
    const int total = c.ntok*(c.n_head/c.n_head_kv);
    if (mmvq_tpr(c.dk) != tpr || mmvq_ncols(total) != ncols || total > 8) {
        fprintf(stderr, "mmvq case does not match its instance (tpr %d, ncols %d)\n", mmvq_tpr(c.dk), mmvq_ncols(total));
        abort();
    }
    std::mt19937 g(seed);
    const int kv_size = c.n_kv + 5;
    const size_t rb = qblock_bytes(type)*(c.dk/32);
    // the cache [n_head_kv rows per cell][kv_size cells][n_stream]
    std::vector<char>  kc(rb*c.n_head_kv*kv_size*c.n_stream);
    std::vector<float> kd((size_t) c.dk*c.n_head_kv*kv_size*c.n_stream);
    for (size_t r = 0; r < (size_t) c.n_head_kv*kv_size*c.n_stream; ++r) {
        make_qrow(g, type, c.dk, kc.data() + r*rb, kd.data() + r*c.dk);
    }
    // queries [d_k, n_head, n_tokens, n_stream] contiguous, read as [d_k, n_tokens, n_head, n_stream]
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> q((size_t) c.dk*c.n_head*c.ntok*c.n_stream);
    for (auto & x : q) x = u(g);
    std::vector<float> dst((size_t) c.n_kv*c.ntok*c.n_head*c.n_stream, NAN);

    // mul_mat_vec_q_short_launch
    const int ne02 = c.n_head_kv, ne03 = c.n_stream, r2 = c.n_head/c.n_head_kv, r3 = 1;
    const int nmat = ne02*ne03;
    const int ntiles = (total + ncols - 1)/ncols;
    constexpr int rpi = MMVQ_SHORT_NTHREADS/tpr;
    constexpr int U   = ncols >= 8 ? 2 : 4;
    int64_t rows_per_block = ((int64_t) c.n_kv*nmat*ntiles + 4*c.nsm - 1)/(4*c.nsm);
    rows_per_block = std::max<int64_t>(rows_per_block, 2*U*rpi);
    rows_per_block = (rows_per_block + U*rpi - 1)/(U*rpi)*(U*rpi);
    const int64_t nchunks = (c.n_kv + rows_per_block - 1)/rows_per_block;
    const size_t smem = (size_t) ncols*c.dk*sizeof(float);
    const int64_t nb01 = (int64_t) rb*c.n_head_kv, nb02 = (int64_t) rb, nb03 = (int64_t) rb*c.n_head_kv*kv_size;
    const int64_t s11 = (int64_t) c.dk*c.n_head, s12 = c.dk, s13 = (int64_t) c.dk*c.n_head*c.ntok;
    const int64_t s1 = c.n_kv, s2 = (int64_t) c.n_kv*c.ntok, s3 = (int64_t) c.n_kv*c.ntok*c.n_head;
    launch(dim3((unsigned) nchunks, (unsigned) nmat, (unsigned) ntiles), dim3(MMVQ_SHORT_NTHREADS), smem, [&] {
        mul_mat_vec_q_short<type, ncols, tpr>(kc.data(), q.data(), dst.data(), c.dk, c.n_kv, ne02, c.ntok, r2, r3,
            nb01, nb02, nb03, s11, s12, s13, s1, s2, s3, (int) rows_per_block, c.rot);
    });

    std::vector<double> ref(dst.size());
    for (int s = 0; s < c.n_stream; ++s) for (int h = 0; h < c.n_head; ++h) for (int t = 0; t < c.ntok; ++t) {
        std::vector<double> y(c.dk);
        for (int i = 0; i < c.dk; ++i) y[i] = q[(((size_t) s*c.ntok + t)*c.n_head + h)*c.dk + i];
        if (c.rot > 0) hadamard_ref(y, c.rot);
        const int hk = h/r2;
        for (int k = 0; k < c.n_kv; ++k) {
            const float * kr = kd.data() + (((size_t) s*kv_size + k)*c.n_head_kv + hk)*c.dk;
            double a = 0;
            for (int i = 0; i < c.dk; ++i) a += kr[i]*y[i];
            ref[k + t*s1 + h*s2 + s*s3] = a;
        }
    }
    bool finite;
    const double e = nmse(ref, dst.data(), dst.size(), &finite);
    const bool ok = finite && e < 1e-9;
    printf("%s mmvq_short %s dk=%d n_kv=%d heads=%d/%d ntok=%d streams=%d rot=%d: cols=%d ncols=%d tpr=%d chunks=%d nmse=%.3g\n",
           ok ? "OK  " : "FAIL", qtype_name(type), c.dk, c.n_kv, c.n_head, c.n_head_kv, c.ntok, c.n_stream, c.rot, total,
           ncols, tpr, (int) nchunks, e);
    return ok;
}

static bool run_mmvq_short() {
    bool all = true;
    const int seed = 100;
    // dk, n_kv, n_head, n_head_kv, ntok, n_stream, rot, nsm
    EMU_CASE(mmvq_run<GGML_TYPE_Q4_0,   4, 16>({128,    1, 32, 8, 1, 1,   0, 104}, seed + g_emu_case)); // 8B: GQA 4
    EMU_CASE(mmvq_run<GGML_TYPE_Q4_0,   8, 16>({128,  133, 32, 8, 2, 1,   0, 104}, seed + g_emu_case)); // 2 tokens: 8 columns
    EMU_CASE(mmvq_run<GGML_TYPE_Q4_1,   4, 16>({128,  301, 32, 8, 1, 2, 128, 104}, seed + g_emu_case)); // rotated (kq), 2 streams
    EMU_CASE(mmvq_run<GGML_TYPE_Q8_0,   4, 16>({128,  257, 32, 8, 1, 1,  64, 132}, seed + g_emu_case));
    EMU_CASE(mmvq_run<GGML_TYPE_Q5_0,   4,  8>({ 64,  129,  9, 3, 1, 1,   0, 104}, seed + g_emu_case)); // SmolLM2: head 64, GQA 3
    EMU_CASE(mmvq_run<GGML_TYPE_Q5_1,   8,  8>({ 64,  515,  9, 3, 2, 1,  64, 104}, seed + g_emu_case)); // 6 columns, rotated
    EMU_CASE(mmvq_run<GGML_TYPE_IQ4_NL, 4,  8>({ 64,   63,  9, 3, 1, 1,   0,   8}, seed + g_emu_case));
    EMU_CASE(mmvq_run<GGML_TYPE_Q8_0,   8,  8>({192,  301, 64, 8, 1, 1,  64, 104}, seed + g_emu_case)); // MiMo K 192 at GQA 8
    EMU_CASE(mmvq_run<GGML_TYPE_Q4_0,   8,  8>({192,  250, 64, 8, 1, 1,   0, 104}, seed + g_emu_case));
    EMU_CASE(mmvq_run<GGML_TYPE_Q4_1,   2, 32>({256,  300,  4, 2, 1, 1, 256, 104}, seed + g_emu_case)); // tpr 32
    EMU_CASE(mmvq_run<GGML_TYPE_Q8_0,   1, 32>({512,  201,  2, 2, 1, 1,   0, 104}, seed + g_emu_case)); // one column, tpr 32
    EMU_CASE(mmvq_run<GGML_TYPE_Q5_0,   8, 32>({256,   77, 16, 2, 1, 1, 128,   4}, seed + g_emu_case));
    EMU_CASE(mmvq_run<GGML_TYPE_IQ4_NL, 2,  4>({ 32,   45,  4, 2, 1, 1,  32, 104}, seed + g_emu_case)); // tpr 4
    return all;
}
