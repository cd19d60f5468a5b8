// A grid's launch on the CPU (cuda_surface.h): blocks one after another, run by the block's threads as std::threads
// (the same threads for every block of the grid), every thread reaching __syncthreads() a block barrier and every warp (EMU_WARP lanes of the linear thread index) a barrier
// of its own for the warp-wide exchanges. Dynamic shared memory is a heap buffer of exactly the launch's size filled
// with NaN before each block (with -fsanitize=address any access past it faults, and a slot read before any thread
// wrote it reaches the output as NaN); the static __shared__ arrays likewise (emu_static_shared). The launch is
// refused past the surface's shared memory limit (gfx90a: 64 KiB), as the GPU's launch would fail.
#pragma once
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

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
    std::unique_ptr<std::barrier<>> bb;
    std::vector<std::unique_ptr<std::barrier<>>> wb(nwarps);
    std::vector<std::barrier<> *> wbp(nwarps);
    // a block's fresh state: shared memory NaN, the static arrays gone, the barriers at full count
    auto setup = [&]() noexcept {
        float * f = (float *) sm.get();
        for (size_t i = 0; i < smem/4; ++i) {
            f[i] = NAN;
        }
        g_smem = sm.get();
        g_static_smem.clear();
        g_static_smem_bytes = 0;
        bb.reset(new std::barrier<>((std::ptrdiff_t) nthreads));
        for (unsigned w = 0; w < nwarps; ++w) {
            wb[w].reset(new std::barrier<>((std::ptrdiff_t) std::min<unsigned>(EMU_WARP, nthreads - w*EMU_WARP)));
            wbp[w] = wb[w].get();
        }
        g_warp_bar  = wbp.data();
        g_block_bar = bb.get();
    };
    setup();
    // the block's threads run its blocks one after another; a thread that has returned from the kernel no longer
    // counts at its block's barriers (as on the GPU, where exited threads do not hold a barrier back), and the last
    // thread to finish a block sets up the next one
    std::barrier block_done((std::ptrdiff_t) nthreads, setup);
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nthreads; ++t) {
        th.emplace_back([&, t] {
            threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x*block.y)};
            for (unsigned b = 0; b < nblocks; ++b) {
                blockIdx = {b % grid.x, (b / grid.x) % grid.y, b / (grid.x*grid.y)};
                kernel();
                g_block_bar->arrive_and_drop();
                g_warp_bar[t / EMU_WARP]->arrive_and_drop();
                block_done.arrive_and_wait();
            }
        });
    }
    for (auto & x : th) {
        x.join();
    }
    g_smem = nullptr;
    g_static_smem.clear();
}
