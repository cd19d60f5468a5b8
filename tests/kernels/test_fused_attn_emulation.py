"""The split/combine algorithm of the fused CUDA decode attention (attn-decode-fused.cu) in numpy.

The kernel cannot run here (no GPU), so this emulates its arithmetic, step for step and with its index
arithmetic, in float32: the host's split sizing (cells per split a multiple of the 64-cell tile, about 4
blocks per SM), the query columns of a block (column col = token col % n_tokens of head h*gqa + col // n_tokens,
tiles of 32 columns, chunks of CG padded with zero queries), the in-place Walsh-Hadamard transform of the
queries (the FWHT_KQ form), per tile the scores with the mask row of the column's token/head/stream, the online
softmax (running max, rescale factor, -inf cells and fully masked tiles/splits), V*P accumulated by phases of
the cells and summed in a fixed order, then either the one-split normalization with the sink or the partial
(m, l, o) per split and the combine kernel. It is compared with a float64 softmax(scale*K.Q + mask, sinks)*V
reference. What it does not check: the CUDA code itself (thread mapping, shared-memory races, shuffles);
those are only compiled here (HIP gfx90a) and run by test-backend-ops on a GPU (`benchmarks/gpu.sh op-tests`).
"""

from __future__ import annotations

import math

import pytest

np = pytest.importorskip("numpy")

AD_TC = 64
AD_CT = 32
NEG_INF = np.float32(-np.inf)


def host_splits(n_kv: int, n_head_kv: int, ntiles: int, n_stream: int, nsm: int = 132) -> tuple[int, int]:
    nblk0 = n_head_kv * ntiles * n_stream
    nsplit_max = max(1, (n_kv + 2 * AD_TC - 1) // (2 * AD_TC))
    nsplit = min(max(1, (4 * nsm + nblk0 - 1) // nblk0), nsplit_max)
    cps = (n_kv + nsplit - 1) // nsplit
    cps = (cps + AD_TC - 1) // AD_TC * AD_TC
    nsplit = (n_kv + cps - 1) // cps
    assert (nsplit - 1) * cps < n_kv  # no empty split
    return nsplit, cps


def fwht_inplace(x: np.ndarray, n: int) -> None:
    """The kernel's shared-memory butterflies over a flat array of segments of n (pairs (i, i + h))."""
    npairs = x.size // 2
    p = np.arange(npairs)
    h = 1
    while h < n:
        i = (p // h) * (2 * h) + p % h
        a = x[i].copy()
        b = x[i + h].copy()
        x[i] = a + b
        x[i + h] = a - b
        h *= 2


def emulate(q, k, v, mask, sinks, scale, n_rot=0, nsm=132):
    """q [n_stream, n_head, ntok, dk] (before the rotation when n_rot), k [n_stream, n_head_kv, n_kv, dk],
    v [n_stream, n_head_kv, n_kv, dv], mask [m_ne3, m_ne2, ntok, n_kv] or None, sinks [n_head] or None.
    Returns dst [n_stream, n_head, ntok, dv] (float32)."""
    n_stream, n_head, ntok, dk = q.shape
    _, n_head_kv, n_kv, dv = v.shape
    gqa = n_head // n_head_kv
    ncols = ntok * gqa
    ntiles = (ncols + AD_CT - 1) // AD_CT
    cg = 1 if ncols == 1 else (4 if ncols <= 4 else 8)
    nsplit, cps = host_splits(n_kv, n_head_kv, ntiles, n_stream, nsm)
    yscale = np.float32(1.0 / math.sqrt(n_rot)) if n_rot else np.float32(1.0)

    dst = np.full((n_stream, n_head, ntok, dv), np.nan, dtype=np.float32)
    part_o = np.full((n_stream, n_head_kv, nsplit, ncols, dv), np.nan, dtype=np.float32)
    part_ml = np.full((n_stream, n_head_kv, nsplit, ncols, 2), np.nan, dtype=np.float32)

    for s in range(n_stream):
        for h in range(n_head_kv):
            for tile in range(ntiles):
                col0 = tile * AD_CT
                nc = min(AD_CT, ncols - col0)
                nchunk = (nc + cg - 1) // cg
                ncp = nchunk * cg
                cols = np.arange(col0, col0 + nc)
                toks = cols % ntok
                heads = h * gqa + cols // ntok
                q_sh = np.zeros((ncp, dk), dtype=np.float32)
                q_sh[:nc] = q[s, heads, toks] * yscale
                if n_rot:
                    flat = q_sh.reshape(-1)
                    fwht_inplace(flat, n_rot)
                    q_sh = flat.reshape(ncp, dk)
                mrows = None if mask is None else mask[s % mask.shape[0], heads % mask.shape[1], toks]  # [nc, n_kv]
                nph = max(1, 128 // ((dv // 8) * nchunk))
                for z in range(nsplit):
                    span = (z * cps, min(z * cps + cps, n_kv))
                    o, m_sh, l_sh = _split_tile(q_sh, k[s, h], v[s, h], mrows, scale, span, nc, nph)
                    for c in range(nc):
                        col = col0 + c
                        if nsplit == 1:
                            head = h * gqa + col // ntok
                            sink = None if sinks is None else np.float32(sinks[head])
                            dst[s, head, col % ntok] = _normalize(o[c], m_sh[c], l_sh[c], sink)
                        else:
                            part_o[s, h, z, col] = o[c]
                            part_ml[s, h, z, col] = (m_sh[c], l_sh[c])
            if nsplit > 1:
                for col in range(ncols):  # combine: one block per (column, KV head, stream)
                    head = h * gqa + col // ntok
                    sink = None if sinks is None else np.float32(sinks[head])
                    dst[s, head, col % ntok] = _combine(part_o[s, h, :, col], part_ml[s, h, :, col], sink)
    return dst


def _split_tile(q_sh, kh, vh, mrows, scale, span, nc, nph):
    """One block's cells ``span`` for one tile of columns: scores, online softmax and V*P per 64-cell tile, the
    accumulators kept per phase (cells ph, ph + nph, ...) and summed in order. Returns (o, m, l) per column."""
    ncp, dv = q_sh.shape[0], vh.shape[1]
    m_sh = np.full(AD_CT, NEG_INF, dtype=np.float32)
    l_sh = np.zeros(AD_CT, dtype=np.float32)
    acc = np.zeros((nph, ncp, dv), dtype=np.float32)
    for t0 in range(span[0], span[1], AD_TC):
        tn = min(AD_TC, span[1] - t0)
        # A. scores; padded columns 0, cells past the split: untouched by B (c >= tn)
        s_sh = np.zeros((AD_TC, ncp), dtype=np.float32)
        sc = (kh[t0 : t0 + tn] @ q_sh[:nc].T).astype(np.float32) * np.float32(scale)  # [tn, nc]
        if mrows is not None:
            sc = sc + mrows[:, t0 : t0 + tn].T
        s_sh[:tn, :nc] = sc
        # B. online softmax
        m_old = m_sh[:nc].copy()
        m_new = np.maximum(m_old, np.max(s_sh[:tn, :nc], axis=0))
        sv = s_sh[:tn, :nc]
        with np.errstate(invalid="ignore", over="ignore"):
            pr = np.where(sv == NEG_INF, np.float32(0), np.exp(sv - m_new[None, :])).astype(np.float32)
            alpha = np.where(m_old == NEG_INF, np.float32(0), np.exp(m_old - m_new)).astype(np.float32)
        s_sh[:tn, :nc] = pr
        s_sh[tn:, :nc] = 0
        l_sh[:nc] = l_sh[:nc] * alpha + pr.sum(axis=0, dtype=np.float32)
        m_sh[:nc] = m_new
        a_full = np.ones(ncp, dtype=np.float32)
        a_full[:nc] = alpha
        # C. V*P by phases
        acc *= a_full[None, :, None]
        vt = vh[t0 : t0 + tn]  # [tn, dv]
        for ph in range(nph):
            idx = np.arange(ph, tn, nph)
            if idx.size:
                acc[ph] += (s_sh[idx, :].T @ vt[idx]).astype(np.float32)
    o = acc[0].copy()
    for ph in range(1, nph):
        o = o + acc[ph]
    return o, m_sh, l_sh


def _normalize(o, m, lsum, sink):
    """One split: the column's output, the sink joining the max and the sum only."""
    f = np.float32(1)
    if sink is not None:
        mn = max(m, sink)
        f = np.float32(0) if m == NEG_INF else np.float32(np.exp(m - mn))
        lsum = lsum * f + np.float32(np.exp(sink - mn))
    return o * f / lsum


def _combine(part_o, part_ml, sink):
    """Several splits: their partial (m, l, o) merged in split order, as k_attn_decode_combine does."""
    mz = part_ml[:, 0]
    m = max(sink if sink is not None else NEG_INF, mz.max())
    with np.errstate(invalid="ignore"):
        w = np.where(mz == NEG_INF, np.float32(0), np.exp(mz - m)).astype(np.float32)
    lsum = np.float32(np.exp(sink - m)) if sink is not None else np.float32(0)
    for z in range(len(mz)):
        lsum = lsum + w[z] * part_ml[z, 1]
    o = np.zeros(part_o.shape[1], dtype=np.float32)
    for z in range(len(mz)):
        o = o + w[z] * part_o[z]
    return o * (np.float32(1) / lsum)


def hadamard(n: int) -> np.ndarray:
    r = np.arange(n)
    bits = np.vectorize(lambda x: bin(x).count("1"))(r[:, None] & r[None, :])
    return np.where(bits % 2 == 0, 1.0, -1.0) / math.sqrt(n)


def reference(q, k, v, mask, sinks, scale, n_rot=0):
    q = q.astype(np.float64)
    n_stream, n_head, ntok, dk = q.shape
    if n_rot:
        H = hadamard(n_rot)
        q = (q.reshape(-1, n_rot) @ H.T).reshape(q.shape)
    n_head_kv = k.shape[1]
    gqa = n_head // n_head_kv
    out = np.zeros((n_stream, n_head, ntok, v.shape[3]))
    for s in range(n_stream):
        for hd in range(n_head):
            kk = k[s, hd // gqa].astype(np.float64)
            vv = v[s, hd // gqa].astype(np.float64)
            sc = q[s, hd] @ kk.T * scale  # [ntok, n_kv]
            if mask is not None:
                sc = sc + mask[s % mask.shape[0], hd % mask.shape[1]].astype(np.float64)
            m = sc.max(axis=1, keepdims=True)
            if sinks is not None:
                m = np.maximum(m, sinks[hd])
            p = np.exp(sc - m)
            den = p.sum(axis=1, keepdims=True)
            if sinks is not None:
                den = den + np.exp(sinks[hd] - m)
            out[s, hd] = (p / den) @ vv
    return out


def make_mask(rng, n_stream, ntok, n_kv):
    m = rng.uniform(-1, 1, size=(n_stream, 1, ntok, n_kv)).astype(np.float32)
    c = np.arange(n_kv)[None, :]
    r = np.arange(ntok)[:, None]
    for s in range(n_stream):
        causal = c >= n_kv - ntok + r + 1
        hole = (c * 7 + r * 13 + s * 5) % 11 == 0
        window = (n_kv >= 1024) & (c >= n_kv // 4) & (c < n_kv // 2)
        masked = (c > 0) & (causal | hole | window)
        m[s, 0][masked] = -np.inf
    return m


CASES = [
    # dk, dv, n_head, n_head_kv, n_kv, ntok, sinks, n_rot, n_stream, nsm
    (128, 128, 32, 8, 1, 1, False, 0, 1, 132),
    (128, 128, 32, 8, 127, 2, True, 0, 1, 132),
    (128, 128, 32, 8, 4096, 1, True, 0, 1, 132),
    (128, 128, 32, 8, 4096, 8, False, 0, 1, 132),
    (192, 128, 64, 4, 2000, 1, True, 0, 1, 132),  # MiMo full: GQA 16
    (192, 128, 64, 4, 1100, 4, True, 0, 1, 132),  # 64 columns: 2 tiles of 32
    (192, 128, 64, 8, 1500, 8, False, 0, 1, 132),  # MiMo SWA, 64 columns
    (192, 128, 64, 4, 300, 8, True, 0, 1, 132),  # 128 columns, 4 tiles
    (64, 64, 16, 4, 700, 3, True, 0, 1, 104),  # ncols 12: chunks of 8, padded
    (256, 256, 16, 2, 1300, 2, False, 0, 1, 104),
    (128, 128, 8, 8, 513, 1, False, 0, 1, 132),  # GQA 1, one column
    (128, 128, 32, 8, 1024, 2, True, 0, 2, 132),  # 2 streams
    (128, 128, 32, 8, 4096, 1, True, 128, 1, 132),  # rotated queries
    (192, 128, 64, 4, 777, 2, False, 64, 1, 132),
    (128, 128, 32, 8, 65, 1, True, 0, 1, 4),  # few SMs: one split of two tiles
]


@pytest.mark.parametrize("dk,dv,n_head,n_head_kv,n_kv,ntok,use_sinks,n_rot,n_stream,nsm", CASES)
def test_fused_attn_split_combine_matches_softmax(
    dk, dv, n_head, n_head_kv, n_kv, ntok, use_sinks, n_rot, n_stream, nsm
):
    rng = np.random.default_rng(dk * 131 + n_kv * 7 + ntok)
    q = rng.uniform(-3, 3, size=(n_stream, n_head, ntok, dk)).astype(np.float32)
    k = rng.uniform(-1, 1, size=(n_stream, n_head_kv, n_kv, dk)).astype(np.float32)
    v = rng.uniform(-1, 1, size=(n_stream, n_head_kv, n_kv, dv)).astype(np.float32)
    mask = make_mask(rng, n_stream, ntok, n_kv)
    sinks = rng.uniform(-2, 4, size=n_head).astype(np.float32) if use_sinks else None
    scale = 1.0 / math.sqrt(dk)
    got = emulate(q, k, v, mask, sinks, scale, n_rot, nsm).astype(np.float64)
    want = reference(q, k, v, mask, sinks, scale, n_rot)
    assert np.all(np.isfinite(got))
    nmse = np.sum((got - want) ** 2) / np.sum(want**2)
    assert nmse < 1e-10, nmse


def test_split_sizes_cover_the_cells_once():
    for n_kv in (1, 63, 64, 65, 127, 128, 129, 4096, 32768, 100000):
        for nblk0 in (1, 4, 8, 16, 64, 528, 2000):
            nsplit, cps = host_splits(n_kv, nblk0, 1, 1)
            assert cps % AD_TC == 0 and nsplit >= 1
            assert (nsplit - 1) * cps < n_kv <= nsplit * cps
