#pragma once

// llama-vq: the quantized OUT_PROD of the CPU backend (llama-vq-out-prod.cpp), declared for ops.cpp's
// ggml_compute_forward_out_prod and for ggml_graph_plan (ggml-cpu.c); ops.h includes this header.

#include "ggml.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

// dst = out_prod(src0, src1) with a quantized src0; src0 may broadcast over dims 2 and 3
void ggml_compute_forward_out_prod_q_f32(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// bytes of wdata ggml_compute_forward_out_prod_q_f32 needs with n_tasks threads
size_t ggml_cpu_out_prod_q_wsize(int n_tasks, const struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
