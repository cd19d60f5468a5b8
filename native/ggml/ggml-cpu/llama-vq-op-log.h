#pragma once

// llama-vq: with LLAMA_VQ_CPU_OP_LOG=1 the first run of each CPU kernel of ours in a process writes one line to
// stderr ("llama-vq: CPU kernel ran: out_prod q4_0"), so that a test or an operator can tell that our kernel, not
// upstream's path, ran in that process (an rpc-server's, for one: it never exits, so counts at exit would not do).
// Called by thread 0 of the op; *logged is the kernel's own flag (a benign race at worst prints the line twice).

#include "ggml.h"

#include <stdio.h>
#include <stdlib.h>

static inline void llama_vq_cpu_op_log_first(int * logged, const char * kernel, enum ggml_type type) {
    if (*logged) {
        return;
    }
    *logged = 1;
    const char * e = getenv("LLAMA_VQ_CPU_OP_LOG");
    if (e != NULL && atoi(e) != 0) {
        fprintf(stderr, "llama-vq: CPU kernel ran: %s %s\n", kernel, ggml_type_name(type));
    }
}
