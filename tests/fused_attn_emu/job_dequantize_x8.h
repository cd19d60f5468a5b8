// dequantize-x8.cuh: dequantize_x8_rows, the dequantization of a (permuted) quantized tensor to F32 or F16
// with dequantize_x8 (which mmvq-short, out-prod and the fused attention use too), for the six types. Reference: the
// blocks decoded from ggml-common.h's layouts (blocks.h). Bounds: F32 1e-12 (one f32 rounding per value at most:
// NMSE < 2^-46), F16 3e-7 (one rounding to f16: relative 2^-11, NMSE < 2.4e-7).
#pragma once

template <ggml_type type, typename T>
static bool dequantize_x8_run(const int ne00, const int ne01, const int ne02, const int seed) {
    std::mt19937 g(seed);
    const size_t rb = qblock_bytes(type)*(ne00/32);
    // a permuted view: rows i01 strided by ne02 rows, matrices i02 by one row (the K/V cache's [d, n_kv, n_head_kv])
    std::vector<char>  x(rb*ne01*ne02);
    std::vector<float> dec((size_t) ne00*ne01*ne02);
    for (int r = 0; r < ne01*ne02; ++r) {
        make_qrow(g, type, ne00, x.data() + r*rb, dec.data() + (size_t) r*ne00);
    }
    std::vector<T> y((size_t) ne00*ne01*ne02);
    const int64_t nb01 = (int64_t) rb*ne02, nb02 = (int64_t) rb, nb03 = (int64_t) rb*ne01*ne02;
    launch(dim3((unsigned) ((ne01*(ne00/8) + 255)/256), (unsigned) ne02, 1), dim3(256), 0, [&] {
        dequantize_x8_rows<type, T>(x.data(), y.data(), ne00, ne01, ne02, 1, nb01, nb02, nb03);
    });
    std::vector<double> ref(y.size());
    std::vector<float>  got(y.size());
    for (int i02 = 0; i02 < ne02; ++i02) for (int i01 = 0; i01 < ne01; ++i01) for (int i = 0; i < ne00; ++i) {
        const size_t o = ((size_t) i02*ne01 + i01)*ne00 + i;
        ref[o] = dec[((size_t) i01*ne02 + i02)*ne00 + i];
        got[o] = (float) y[o];
    }
    bool finite;
    const double e = nmse(ref, got.data(), got.size(), &finite);
    const bool f16 = std::is_same_v<T, half>;
    const bool ok = finite && e < (f16 ? 3e-7 : 1e-12);
    printf("%s dequantize_x8_rows %s -> %s ne00=%d ne01=%d ne02=%d: nmse=%.3g\n", ok ? "OK  " : "FAIL", qtype_name(type),
           f16 ? "f16" : "f32", ne00, ne01, ne02, e);
    return ok;
}

static bool run_dequantize_x8() {
    bool all = true;
    const int seed = 400;
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q4_0,   float>(128, 333, 8, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q4_1,   float>( 64, 129, 3, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q5_0,   float>(192,  77, 4, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q5_1,   float>(128, 101, 2, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q8_0,   float>(128, 257, 8, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_IQ4_NL, float>( 32, 301, 2, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q4_0,   half >(128, 100, 4, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q4_1,   half >(192,  65, 2, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q5_0,   half >( 64, 127, 3, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q5_1,   half >( 64,  33, 3, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_Q8_0,   half >(256,  50, 2, seed + g_emu_case));
    EMU_CASE(dequantize_x8_run<GGML_TYPE_IQ4_NL, half >(128,  99, 2, seed + g_emu_case));
    return all;
}
