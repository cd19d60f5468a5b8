// Test data for the kernel harnesses: rows of random quantized blocks of the six types our kernels take (q4_0, q4_1,
// q5_0, q5_1, q8_0, iq4_nl), and a decoder of ggml's block layouts written here from ggml-common.h's definitions,
// independent of dequantize-x8.cuh (the code under test); the float64 Hadamard rotation; NMSE. Needs cuda_surface.h.
#pragma once
#include <random>
#include <vector>

static size_t qblock_bytes(const ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q4_0:   return sizeof(block_q4_0);
        case GGML_TYPE_Q4_1:   return sizeof(block_q4_1);
        case GGML_TYPE_Q5_0:   return sizeof(block_q5_0);
        case GGML_TYPE_Q5_1:   return sizeof(block_q5_1);
        case GGML_TYPE_Q8_0:   return sizeof(block_q8_0);
        case GGML_TYPE_IQ4_NL: return sizeof(block_iq4_nl);
        default: abort();
    }
}

static const char * qtype_name(const ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q4_0:   return "q4_0";
        case GGML_TYPE_Q4_1:   return "q4_1";
        case GGML_TYPE_Q5_0:   return "q5_0";
        case GGML_TYPE_Q5_1:   return "q5_1";
        case GGML_TYPE_Q8_0:   return "q8_0";
        case GGML_TYPE_IQ4_NL: return "iq4_nl";
        default: return "?";
    }
}

// value j (0..31) of a block: q4/q5/iq4_nl hold elements j and j + 16 in the low and high nibble of byte j % 16;
// q5's fifth bits are bit j of qh
static float decode_value(const ggml_type t, const char * blk, const int j) {
    const int lo = j < 16;
    const int jb = j % 16;
    switch (t) {
        case GGML_TYPE_Q4_0: {
            const block_q4_0 * b = (const block_q4_0 *) blk;
            const int n = lo ? b->qs[jb] & 15 : b->qs[jb] >> 4;
            return fp16_to_fp32(b->d.bits) * (n - 8);
        }
        case GGML_TYPE_Q4_1: {
            const block_q4_1 * b = (const block_q4_1 *) blk;
            const int n = lo ? b->qs[jb] & 15 : b->qs[jb] >> 4;
            return fp16_to_fp32(b->dm.x.bits) * n + fp16_to_fp32(b->dm.y.bits);
        }
        case GGML_TYPE_Q5_0: {
            const block_q5_0 * b = (const block_q5_0 *) blk;
            uint32_t qh;
            std::memcpy(&qh, b->qh, 4);
            const int n = (lo ? b->qs[jb] & 15 : b->qs[jb] >> 4) | (int) ((qh >> j) & 1) << 4;
            return fp16_to_fp32(b->d.bits) * (n - 16);
        }
        case GGML_TYPE_Q5_1: {
            const block_q5_1 * b = (const block_q5_1 *) blk;
            uint32_t qh;
            std::memcpy(&qh, b->qh, 4);
            const int n = (lo ? b->qs[jb] & 15 : b->qs[jb] >> 4) | (int) ((qh >> j) & 1) << 4;
            return fp16_to_fp32(b->dm.x.bits) * n + fp16_to_fp32(b->dm.y.bits);
        }
        case GGML_TYPE_Q8_0: {
            const block_q8_0 * b = (const block_q8_0 *) blk;
            return fp16_to_fp32(b->d.bits) * b->qs[j];
        }
        case GGML_TYPE_IQ4_NL: {
            const block_iq4_nl * b = (const block_iq4_nl *) blk;
            const int n = lo ? b->qs[jb] & 15 : b->qs[jb] >> 4;
            return fp16_to_fp32(b->d.bits) * kvalues_iq4nl[n];
        }
        default: abort();
    }
}

static void decode_row(const ggml_type t, const char * row, const int d, float * out) {
    for (int i = 0; i < d; ++i) {
        out[i] = decode_value(t, row + (i/32)*qblock_bytes(t), i % 32);
    }
}

static uint16_t rand_half(std::mt19937 & g, int emin, int emax) { // a positive normal half in [2^(emin-15), 2^(emax-14))
    std::uniform_int_distribution<int> e(emin, emax), m(0, 1023);
    return (uint16_t) ((e(g) << 10) | m(g));
}

// a row of d values (d a multiple of 32): random bytes and scales (values of magnitude ~1), decoded into dec
static void make_qrow(std::mt19937 & g, const ggml_type t, const int d, char * out, float * dec) {
    std::uniform_int_distribution<int> byte(0, 255);
    const size_t bb = qblock_bytes(t);
    for (int b = 0; b < d/32; ++b) {
        char * blk = out + b*bb;
        for (size_t i = 0; i < bb; ++i) {
            blk[i] = (char) byte(g);
        }
        // the scales (first 2 or 4 bytes of every block type here): d > 0, and q4_1/q5_1's minimum negative
        const bool has_min = t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q5_1;
        const uint16_t sd = t == GGML_TYPE_Q8_0 ? rand_half(g, 5, 8) : t == GGML_TYPE_IQ4_NL ? rand_half(g, 7, 10) :
                            (t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q5_1) ? rand_half(g, 8, 11) : rand_half(g, 9, 12);
        std::memcpy(blk, &sd, 2);
        if (has_min) {
            const uint16_t sm = (uint16_t) (rand_half(g, 12, 14) | 0x8000);
            std::memcpy(blk + 2, &sm, 2);
        }
    }
    if (dec) {
        decode_row(t, out, d, dec);
    }
}

// the Walsh-Hadamard matrix of n (Sylvester order) times 1/sqrt(n), applied to every n-segment of x
static void hadamard_ref(std::vector<double> & x, const int n) {
    std::vector<double> y(x.size());
    for (size_t s0 = 0; s0 < x.size(); s0 += n) {
        for (int r = 0; r < n; ++r) {
            double a = 0;
            for (int j = 0; j < n; ++j) {
                a += (__builtin_popcount((unsigned) (r & j)) % 2 ? -1.0 : 1.0)*x[s0 + j];
            }
            y[s0 + r] = a/std::sqrt((double) n);
        }
    }
    x = y;
}

// the cases a run takes (kernels_harness's second argument, "i,j,...": those indices of the job's list; all if empty)
static std::vector<int> g_emu_cases;
static int g_emu_case = 0;
static bool emu_case_selected() {
    const int i = g_emu_case++;
    return g_emu_cases.empty() || std::find(g_emu_cases.begin(), g_emu_cases.end(), i) != g_emu_cases.end();
}
#define EMU_CASE(...) if (emu_case_selected()) all = (__VA_ARGS__) && all

static double nmse(const std::vector<double> & ref, const float * got, const size_t n, bool * finite) {
    double num = 0, den = 0;
    *finite = true;
    for (size_t i = 0; i < n; ++i) {
        *finite = *finite && std::isfinite(got[i]);
        num += (got[i] - ref[i])*(got[i] - ref[i]);
        den += ref[i]*ref[i];
    }
    return num/den;
}
