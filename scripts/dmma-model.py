#!/usr/bin/env python3
"""A lane-level model of the causal product on FP64 tensor cores.

src/cuda/semiseparable.cu (dmma_phase1, dmma_phase2) runs the causal product
y_i = u_i . (S0 + sum_{j <= i} v_j x_j^T) one warp at a time in tiles of 8 rows
with the m8n8k4 f64 mma. Its operands come straight from each lane's registers
by two orders of the sums chosen so that nothing moves between lanes. This
model follows the kernel's per-lane indexing, with the mma's fragment layouts
as the PTX ISA gives them (lane = 4 g + q: A[g][q], B[q][g], C[g][2 q + e]),
and checks y and the final state against the plain recurrence. It needs no GPU
(python3 with numpy): run it after changing how the kernel indexes its operands.

  python3 scripts/dmma-model.py      # exit status 0 when every shape matches
"""
import sys

import numpy as np


def mma(c, a, b):
    """D = A B + C for one m8n8k4 f64 mma; a, b: a value per lane; c: two per lane."""
    am, bm, cm = np.zeros((8, 4)), np.zeros((4, 8)), np.zeros((8, 8))
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        am[g][q], bm[q][g] = a[lane], b[lane]
        cm[g][2 * q], cm[g][2 * q + 1] = c[lane]
    dm = am @ bm + cm
    return [(dm[lane >> 2][2 * (lane & 3)], dm[lane >> 2][2 * (lane & 3) + 1]) for lane in range(32)]


def warp(x, u, v, s0):
    """One warp's rows, as the kernel's phase 2 walks them: y and the final state."""
    n, D = x.shape
    r = u.shape[1]
    MT, KP = D // 8, (r + 7) // 8 * 8
    NT, KS = KP // 8, KP // 4
    lanes = range(32)

    def at(m, j, k, kmax):  # a row's element, 0 past the rows or past kmax
        return m[j][k] if j < n and k < kmax else 0.0

    # S[mm, nt] lane (g, q) holds S^T[8 mm + g][8 nt + 2 q + e]
    S = {(mm, nt): [tuple(s0[k][8 * mm + (l >> 2)] if (k := 8 * nt + 2 * (l & 3) + e) < r else 0.0 for e in range(2))
                    for l in lanes]
         for mm in range(MT) for nt in range(NT)}
    y = np.full((n, D), np.nan)
    for j0 in range(0, n, 8):
        # over rows, k-step s takes row 2 q + s; over ranks, k-step kk takes rank 8 (kk / 2) + 2 q + kk % 2
        xa = {(s, mm): [at(x, j0 + 2 * (l & 3) + s, 8 * mm + (l >> 2), D) for l in lanes]
              for s in range(2) for mm in range(MT)}
        vs = {(s, nt): [at(v, j0 + 2 * (l & 3) + s, 8 * nt + (l >> 2), r) for l in lanes]
              for s in range(2) for nt in range(NT)}
        ua = {kk: [at(u, j0 + (l >> 2), 8 * (kk >> 1) + 2 * (l & 3) + (kk & 1), r) for l in lanes] for kk in range(KS)}
        va = {kk: [at(v, j0 + (l >> 2), 8 * (kk >> 1) + 2 * (l & 3) + (kk & 1), r) for l in lanes] for kk in range(KS)}
        G = [(0.0, 0.0)] * 32
        for kk in range(KS):  # G = U_t V_t^T
            G = mma(G, ua[kk], va[kk])
        G = [tuple(G[l][e] if 2 * (l & 3) + e <= (l >> 2) else 0.0 for e in range(2)) for l in lanes]
        for mm in range(MT):
            Y = [(0.0, 0.0)] * 32
            for s in range(2):  # X^T G^T: G's accumulator is the B operand as it stands
                Y = mma(Y, xa[(s, mm)], [G[l][s] for l in lanes])
            for kk in range(KS):  # S^T U^T: S's accumulators are the A operand as they stand
                Y = mma(Y, [S[(mm, kk >> 1)][l][kk & 1] for l in lanes], ua[kk])
            for l in lanes:
                for e in range(2):
                    j = j0 + 2 * (l & 3) + e
                    if j < n:
                        y[j][8 * mm + (l >> 2)] = Y[l][e]
        for s in range(2):  # S += V_t^T X_t
            for mm in range(MT):
                for nt in range(NT):
                    S[(mm, nt)] = mma(S[(mm, nt)], xa[(s, mm)], vs[(s, nt)])
    sf = np.zeros((r, D))
    for (mm, nt), frag in S.items():
        for l in lanes:
            for e in range(2):
                k = 8 * nt + 2 * (l & 3) + e
                if k < r:
                    sf[k][8 * mm + (l >> 2)] = frag[l][e]
    return y, sf


def main():
    rng = np.random.default_rng(1)
    ok = True
    # rows: whole tiles and a part-filled last one; D 8 and 16; r odd, even, a multiple of 8, 1 and 32
    for n, r, D in [(48, 22, 16), (37, 22, 16), (21, 7, 8), (40, 32, 16), (13, 1, 8), (64, 17, 16), (8, 8, 8)]:
        x, u, v, s0 = (rng.standard_normal(s) for s in [(n, D), (n, r), (n, r), (r, D)])
        ref, s = np.zeros((n, D)), s0.copy()
        for i in range(n):
            s += np.outer(v[i], x[i])
            ref[i] = u[i] @ s
        y, sf = warp(x, u, v, s0)
        ey, es = np.abs(y - ref).max() / np.abs(ref).max(), np.abs(sf - s).max() / np.abs(s).max()
        good = ey < 1e-12 and es < 1e-12
        ok &= good
        print(f"n {n:3d} r {r:2d} D {D:2d}: y {ey:.1e}, state {es:.1e} {'ok' if good else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
