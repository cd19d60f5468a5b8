// Runs our CUDA kernels other than the fused attention (harness.cpp) on the CPU, on the CUDA surface or, with
// -DGGML_USE_HIP, gfx90a's (cuda_surface.h, launch.h): the short-row K*Q with and without the query rotation
// (mmvq-short.cu), the quantized OUT_PROD's vector kernel and combine (out-prod-q.cu), the rotation fusions with the rope
// fold (fwht-fused.cu) and dequantize_x8_rows (dequantize-x8.cuh). The kernels' text is the files the build compiles
// (the *_INC parts, cut by tests/support/kernel_emu_support.py); each job states its references and bounds.
//
//   kernels_harness JOB [I,J,...]   JOB = mmvq_short | out_prod | fwht_fused | dequantize_x8; one line per case
//                                   (only cases I, J, ... of the job's list if given), then "all passed" (exit
//                                   status 0) or "FAILED" (1)
#include "cuda_surface.h"
#include "launch.h"

#include DEQ_INC   // dequantize-x8.cuh's device part
#include QUANT_INC // cpy-utils.cuh's block quantizers (upstream's, for fwht-fused's stores)

#include "blocks.h"
// EMU_JOBS: the jobs compiled in (a bit each, as below; all by default): a test that runs one job builds only it
#ifndef EMU_JOBS
#define EMU_JOBS 15
#endif
#if EMU_JOBS & 1
#include "job_dequantize_x8.h"
#endif
#if EMU_JOBS & 2
#include "job_mmvq_short.h"
#endif
#if EMU_JOBS & 4
#include "job_out_prod.h"
#endif
#if EMU_JOBS & 8
#include "job_fwht_fused.h"
#endif

int main(int argc, char ** argv) {
    const char * job = argc > 1 ? argv[1] : "";
    for (const char * s = argc > 2 ? argv[2] : nullptr; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : nullptr) {
        g_emu_cases.push_back(atoi(s));
    }
    bool all;
    if (false) {
#if EMU_JOBS & 1
    } else if (!strcmp(job, "dequantize_x8")) {
        all = run_dequantize_x8();
#endif
#if EMU_JOBS & 2
    } else if (!strcmp(job, "mmvq_short")) {
        all = run_mmvq_short();
#endif
#if EMU_JOBS & 4
    } else if (!strcmp(job, "out_prod")) {
        all = run_out_prod();
#endif
#if EMU_JOBS & 8
    } else if (!strcmp(job, "fwht_fused")) {
        all = run_fwht_fused();
#endif
    } else {
        fprintf(stderr, "usage: %s mmvq_short|out_prod|fwht_fused|dequantize_x8\n", argv[0]);
        return 2;
    }
    printf("surface %s, warp %d: %s\n", EMU_WARP == 64 ? "hip" : "cuda", EMU_WARP, all ? "all passed" : "FAILED");
    return all ? 0 : 1;
}
