// A grid's launch on the CPU (cuda_surface.h): blocks one after another, each block's threads run as fibers (fibers.h)
// from the block's start to their return, every thread reaching __syncthreads() a block barrier and every warp (EMU_WARP
// lanes of the linear thread index) a barrier of its own for the warp-wide exchanges. Dynamic shared memory is a heap
// buffer of exactly the launch's size filled with NaN before each block (with -fsanitize=address any access past it
// faults, and a slot read before any thread wrote it reaches the output as NaN); the static __shared__ arrays likewise
// (emu_static_shared). The launch is refused past the surface's shared memory limit (gfx90a: 64 KiB), as the GPU's
// launch would fail.
#pragma once
#include <memory>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// one thread of a block: the kernel, then out of its barriers (as on the GPU, a thread that has returned no longer
// holds its block's or its warp's barrier back)
template <typename F>
static void emu_block_thread(void * kernel) {
    (*(F *) kernel)();
    const int t = emu_tid();
    emu_drop(g_block_bar);
    emu_drop(g_warp_bar[t / EMU_WARP]);
}

template <typename F>
static void launch(const dim3 grid, const dim3 block, const size_t smem, F kernel) {
    if (smem > EMU_LDS_LIMIT) {
        fprintf(stderr, "launch refused: %zu bytes of dynamic shared memory, the limit is %zu\n", smem, EMU_LDS_LIMIT);
        abort();
    }
    const unsigned nthreads = block.x*block.y*block.z;
    const unsigned nwarps   = (nthreads + EMU_WARP - 1)/EMU_WARP;
    const unsigned nblocks  = grid.x*grid.y*grid.z;
    blockDim = {block.x, block.y, block.z};
    gridDim  = {grid.x, grid.y, grid.z};
    g_smem_dynamic = smem;
    std::unique_ptr<int64_t[]> sm(new int64_t[(smem + 7)/8 + 1]);
    auto bb = std::make_unique<emu_barrier>();
    std::vector<std::unique_ptr<emu_barrier>> wb(nwarps);
    std::vector<emu_barrier *> wbp(nwarps);
    for (unsigned w = 0; w < nwarps; ++w) {
        wb[w] = std::make_unique<emu_barrier>();
        wbp[w] = wb[w].get();
    }
    for (unsigned t = 0; t < nthreads && t < (unsigned) EMU_MAX_THREADS; ++t) {
        g_fibers[t].tidx = {t % block.x, (t / block.x) % block.y, t / (block.x*block.y)};
    }
    for (unsigned b = 0; b < nblocks; ++b) {
        // the block's fresh state: shared memory NaN, the static arrays gone, the barriers at full count
        float * f = (float *) sm.get();
        for (size_t i = 0; i < smem/4; ++i) {
            f[i] = NAN;
        }
        g_smem = sm.get();
        g_static_smem.clear();
        g_static_smem_bytes = 0;
        bb->reset((int) nthreads);
        for (unsigned w = 0; w < nwarps; ++w) {
            wb[w]->reset((int) std::min<unsigned>(EMU_WARP, nthreads - w*EMU_WARP));
        }
        g_warp_bar  = wbp.data();
        g_block_bar = bb.get();
        blockIdx = {b % grid.x, (b / grid.x) % grid.y, b / (grid.x*grid.y)};
#if defined(AD_EMULATE_CP_ASYNC)
        emu_cp_reset((int) nthreads);
#endif
        emu_run_block((int) nthreads, b % 2 == 1, &emu_block_thread<F>, &kernel);
#if defined(AD_EMULATE_CP_ASYNC)
        emu_cp_drop_unwaited((int) nthreads);
#endif
    }
    g_smem = nullptr;
    g_static_smem.clear();
}
