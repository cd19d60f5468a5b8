#pragma once

// llama-vq: how the fused decode attention stages its tiles' K and V rows in shared memory, a part of
// attn-decode-fused.cu (included there after AD_NT, AD_TC and AD_NBUF_MAX; the CPU emulation of the tests includes it
// the same way, with its own cp.async: AD_EMULATE_CP_ASYNC): the host's plan of each thread's walk over a tile's units
// (attn_decode_rows: the unit, windows, the walks), and the block-wide copy of a tile's rows (ad_stage) with cp.async
// where it exists (NVIDIA sm_80+), else by plain loads.

#if defined(CP_ASYNC_AVAILABLE) && !defined(AD_EMULATE_CP_ASYNC)
// cp.async's operations as the staging uses them (the CPU emulation of the tests gives its own: copies that land
// only when a wait covers their group): a copy of UNIT bytes into shared memory (16: .cg, past the L1), the close of
// the group of copies issued since the last, and the waits for all but the newest N groups or for every copy
template <int UNIT>
static __device__ __forceinline__ void ad_cp_async(const unsigned int dst, const char * src) {
    static_assert(UNIT == 16 || UNIT == 8 || UNIT == 4, "cp.async copies 16, 8 or 4 bytes");
    if constexpr (UNIT == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(dst), "l"(src));
    } else if constexpr (UNIT == 8) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" : : "r"(dst), "l"(src));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" : : "r"(dst), "l"(src));
    }
}

static __device__ __forceinline__ void ad_cp_commit() {
    asm volatile("cp.async.commit_group;");
}

template <int N>
static __device__ __forceinline__ void ad_cp_wait() {
    asm volatile("cp.async.wait_group %0;" : : "n"(N));
}

static __device__ __forceinline__ void ad_cp_wait_all() {
    asm volatile("cp.async.wait_all;");
}
#endif // defined(CP_ASYNC_AVAILABLE) && !defined(AD_EMULATE_CP_ASYNC)

// how nt threads walk the staging units of a tile (rows of upr units of `unit` bytes, nb bytes apart in global memory
// and rs in shared memory): the whole block (nt = AD_NT, k_attn_decode) or one warp over its own rows (nt = 32,
// k_attn_decode_tc). Unit i = x + k*nt (x: the thread's index among the nt) is byte o*unit of row r = i/upr; a
// thread's next unit lies dgo / dso bytes on (nt units: dr = nt/upr rows and dox = nt%upr units), and wgo / wso more
// where o passes upr (dox < upr: at most once a step). Planned once (attn_decode_stage_geo, on the host; for windows
// one per offset), so that a tile's walk divides nothing, multiplies only where it starts, and its steps are kernel
// parameters (ptxas reloads them where registers are short rather than spilling); the thread's first row is
// (x*mg) >> 16 with mg = ceil(2^16/upr), exact for x < AD_NT and upr < 2^9. Offsets are 32-bit: a tile's rows lie
// within AD_TC*nb bytes, below 2^31 (ggml_cuda_attn_decode_fused_supported).
struct ad_stage_geo {
    int      unit, rs, nb, upr, dox, mg;
    unsigned dgo, wgo; // modulo 2^32: the offsets of the units a tile has are below 2^31
    int      dso, wso;
};

// the walk of nt threads over rows of `bytes` bytes (a multiple of unit) in units of `unit`, nb bytes apart in global
// memory and rs in shared memory
static ad_stage_geo attn_decode_stage_geo(const int bytes, const int unit, const int64_t nb, const int rs,
        const int nt) {
    ad_stage_geo g;
    g.unit = unit;
    g.rs   = rs;
    g.nb   = (int) std::min<int64_t>(nb, INT32_MAX/AD_TC); // larger strides are not fused (never used)
    g.upr  = bytes/unit;
    const int dr = nt/g.upr;
    g.dox  = nt - dr*g.upr;
    g.mg   = (65536 + g.upr - 1)/g.upr;
    // a step past a tile's last row (dr*nb up to 2^32 for 1-unit rows) is never used for an address: truncated
    g.dgo  = (unsigned) ((int64_t) dr*g.nb + g.dox*unit);
    g.dso  = dr*rs   + g.dox*unit;
    g.wgo  = (unsigned) (g.nb - g.upr*unit);
    g.wso  = rs   - g.upr*unit;
    return g;
}

// the walk of thread x of those a walk was planned for (ad_stage_geo) over the staging units of a tile: the current
// unit's offsets from the tile's first row in global (go) and shared memory (so) and its index in its row (o)
struct ad_walk {
    unsigned go;
    int      so, o;

    __device__ __forceinline__ ad_walk(const ad_stage_geo & g, const int x) {
        const int r = (int) (((unsigned) x*(unsigned) g.mg) >> 16);
        o  = x - r*g.upr;
        go = (unsigned) r*(unsigned) g.nb + (unsigned) (o*g.unit);
        so = r*g.rs + o*g.unit;
    }
    __device__ __forceinline__ void step(const ad_stage_geo & g) {
        go += g.dgo;
        so += g.dso;
        o  += g.dox;
        if (o >= g.upr) {
            o  -= g.upr;
            go += g.wgo;
            so += g.wso;
        }
    }
};

// copy rows [0, tn) of g.upr units of g.unit bytes each (global: src + r*g.nb; shared: dst + r*g.rs) by NT threads,
// this one x of them (g planned for NT): the block (AD_NT, threadIdx.x) or a warp (32, its lane); with cp.async the
// copies are only issued (ad_commit + a wait complete them), else done on return
template <int NT>
static __device__ __forceinline__ void ad_stage(char * dst, const char * src, const ad_stage_geo & g, const int tn,
        const int x) {
    const int unit = g.unit;
    const int n    = tn*g.upr;
    ad_walk   w(g, x);
#ifdef CP_ASYNC_AVAILABLE
    const unsigned int dsts = ggml_cuda_cvta_generic_to_shared(dst);
    if (unit == 16) {
        // the common case (16-byte rows, or windows): one form of copy, no branch per unit
        for (int i = x; i < n; i += NT) {
            ad_cp_async<16>(dsts + w.so, src + w.go);
            w.step(g);
        }
        return;
    }
    for (int i = x; i < n; i += NT) {
        const unsigned int d  = dsts + w.so;
        const char       * gp = src + w.go;
        if (unit == 8) {
            ad_cp_async<8>(d, gp);
        } else if (unit == 4) {
            ad_cp_async<4>(d, gp);
        } else {
            // 2-byte units (rows of an odd number of q4_0 blocks): plain copies
            *(unsigned short *) (dst + w.so) = *(const unsigned short *) gp;
        }
        w.step(g);
    }
#else
    // plain loads, 4 per thread in flight (no barrier or shuffle inside: uniform trip counts not needed)
    constexpr int NU = 4;
    for (int i0 = 0; i0 < n; i0 += NU*NT) {
        int4 buf[NU];
        int  so[NU];
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            so[u] = w.so;
            if (i0 + u*NT + x < n) {
                const char * gp = src + w.go;
                if (unit == 16) {
                    buf[u] = *(const int4 *) gp;
                } else if (unit == 8) {
                    const int2 t = *(const int2 *) gp;
                    buf[u].x = t.x; buf[u].y = t.y;
                } else if (unit == 4) {
                    buf[u].x = *(const int *) gp;
                } else {
                    buf[u].x = *(const unsigned short *) gp;
                }
            }
            w.step(g);
        }
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            if (i0 + u*NT + x < n) {
                char * d = dst + so[u];
                if (unit == 16) {
                    *(int4 *) d = buf[u];
                } else if (unit == 8) {
                    *(int2 *) d = make_int2(buf[u].x, buf[u].y);
                } else if (unit == 4) {
                    *(int *) d = buf[u].x;
                } else {
                    *(unsigned short *) d = (unsigned short) buf[u].x;
                }
            }
        }
    }
#endif // CP_ASYNC_AVAILABLE
}

// close the group of copies issued since the last commit
static __device__ __forceinline__ void ad_commit() {
#ifdef CP_ASYNC_AVAILABLE
    ad_cp_commit();
#endif // CP_ASYNC_AVAILABLE
}

// wait until all of this thread's copies have landed (a barrier of the threads that read them must follow)
static __device__ __forceinline__ void ad_wait_all() {
#ifdef CP_ASYNC_AVAILABLE
    ad_cp_wait_all();
#endif // CP_ASYNC_AVAILABLE
}

// wait until at most the newest group of this thread's copies is pending (a barrier of the threads that read
// them must follow: the block's, or in k_attn_decode_tc the warp's)
static __device__ __forceinline__ void ad_wait_all_but_newest() {
#ifdef CP_ASYNC_AVAILABLE
    ad_cp_wait<1>();
#endif // CP_ASYNC_AVAILABLE
}

// the threads that walk a tile's staging units together: the block's in k_attn_decode, and in k_attn_decode_tc each
// warp's over its own 16 cells of the tile (ad_tc_stage: no block barrier between the tiles)
static int attn_decode_walkers(const bool tc) {
    return tc ? 32 : AD_NT;
}

// bytes per staging unit: the widest of 16/8/4/2 dividing a row's bytes, the base address and every stride
static int attn_decode_unit(const int rb, const uintptr_t base, const int64_t nb1, const int64_t nb2, const int64_t nb3) {
    for (int u = 16; u > 2; u /= 2) {
        if (rb % u == 0 && base % u == 0 && nb1 % u == 0 && nb2 % u == 0 && nb3 % u == 0) {
            return u;
        }
    }
    return 2;
}

// how the rows of rb bytes of a cache (base, strides) are staged: in the widest unit dividing the row, the base and
// the strides (attn_decode_unit), rows rb bytes apart in shared memory; or, where that unit is narrower than 16 bytes
// and the cells are 16-byte aligned apart (nb1), as windows (ad_rows_block): a row of q8_0 d 192 (204 bytes at
// offsets 0, 4, 8, 12 of 16) takes 13-14 copies of 16 bytes instead of 51 of 4. Windowed rows lie rs bytes apart:
// room for the largest offset any block's rows can have, an odd multiple of 16 (eight consecutive rows start in
// eight distinct groups of four banks: the K reads of both forms take 8 rows per warp). The walks g are those of nt
// threads (attn_decode_walkers: the kernel's).
static void attn_decode_rows(const int rb, const uintptr_t base, const int64_t nb1, const int64_t nb2, const int64_t nb3,
        const int nt, int & unit, int & win, int & rs, ad_stage_geo * g) {
    unit = attn_decode_unit(rb, base, nb1, nb2, nb3);
    win  = unit < 16 && nb1 % 16 == 0 && base % 2 == 0 && nb2 % 2 == 0 && nb3 % 2 == 0; // even offsets
    rs   = rb;
    for (int i = 0; i < 8; ++i) {
        g[i] = attn_decode_stage_geo(rb, unit, nb1, rb, nt);
    }
    if (win) {
        // the blocks' first rows lie at base + h*nb2 + s*nb3: their offsets in 16 bytes are base % a + multiples of a
        int a = 16;
        while (nb2 % a != 0 || nb3 % a != 0) {
            a /= 2;
        }
        const int maxoff = (int) (base % a) + 16 - a;
        rs = (maxoff + rb + 15)/16*16;
        rs += (rs/16) % 2 == 0 ? 16 : 0;
        for (int i = 0; i < 8; ++i) { // the walk of a block whose rows lie at offset 2i in 16 bytes
            g[i] = attn_decode_stage_geo((2*i + rb + 15)/16*16, 16, nb1, rs, nt);
        }
    }
}
