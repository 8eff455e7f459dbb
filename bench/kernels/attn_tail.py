#!/usr/bin/env python3
"""attn_tail.py: how much of the Hopper attention kernels' time the grid's tail costs, by a
simulation: blocks of known lengths (key blocks a forward block multiplies, query steps a
backward block walks) handed in launch order to the SM that frees up first, as the hardware
dispatches them (the forward's blocks of 192 query rows at D64, 128 at D128, as the kernel's
since 2026-12-07). Prints the makespan over the ideal (the total spread evenly) for the orders
the kernels could use: the forward's head by head (each head's blocks longest first: its grid
until 2026-12-07), in groups of G heads taking turns (fa3_tile_group's rule, its grid since:
+4% at T8192 on an H100) and longest first over all heads; the backward (a block per kv
head, walking its group's query heads) head by head, shortest first (its grid until 2026-12-07,
as its dQ order was then the last key block first, with a block per query head above 2,048
tokens), in groups of 8 (batch, kv head) rows longest first (its grid since: dQ added first key
block first, each block walking its queries from the last; 6-18% faster on an H100), and
longest first with all rows in turn (near 3ce6ee1's order, with all heads in turn: its blocks
of a head lose L2 and it ran 35% slower at T8192, which this model does not count; nor does it
count the wait of a block for the dQ adds of the blocks of its head started with it).

    python3 bench/kernels/attn_tail.py [SMS]      (default 132, an H100 or H200)

No GPU needed: the lengths are counted, not timed, so per-block costs and the clocks are left
out; what it shows is the share of SMs idle at the end."""
import heapq
import sys

sms = int(sys.argv[1]) if len(sys.argv) > 1 else 132


def dispatch(order, length):
    """each block's start time, the blocks handed in order to the SM that frees first"""
    free = [0] * sms
    start = {}
    for b in order:
        start[b] = heapq.heappop(free)
        heapq.heappush(free, start[b] + length[b])
    return start


def makespan(order, length):
    start = dispatch(order, length)
    return max(start[b] + length[b] for b in order) / (sum(length.values()) / sms)


def in_groups(bh, nblk, g, up=False):
    """blocks (head, block) of g heads at a time, the heads in turn at each block index, the
    indices counting down (the forward's longest first, the backward's shortest), or up"""
    out = []
    for g0 in range(0, bh, g):
        gl = min(g, bh - g0)
        for j in range(gl * nblk):
            k = j // gl
            out.append((g0 + j % gl, k if up else nblk - 1 - k))
    return out


if __name__ == "__main__":
    # (B * H, T, GQA group, D): the op harness's perf shapes (tests/gpu/ops_perf.c)
    shapes = [(32, 8192, 2, 128), (64, 4096, 4, 128), (64, 2048, 2, 64), (16, 32768, 2, 128),
              (16, 131072, 2, 128)]
    print(f"makespan / ideal on {sms} SMs (1.000: no tail)")
    print("| B*H | T | D | fwd head by head | fwd groups (G) | fwd longest first | bwd head by head |"
          " bwd 8 rows in turn, longest first | bwd longest first |")
    print("|---|---|---|---|---|---|---|---|---|")
    for bh, t, group, d in shapes:
        nb = t // 128
        # the forward's tiles: 64 query rows a consumer warpgroup, three at D64 (since
        # 2026-12-07), two at D128; a tile multiplies the key blocks of 128 up to its last row
        bq = 192 if d == 64 else 128
        nq = -(-t // bq)
        fwd = {(h, q): (min((q + 1) * bq, t) - 1) // 128 + 1 for h in range(bh) for q in range(nq)}
        # the backward's blocks: one a kv head walking its group's query heads, 64-query steps
        # (until 2026-12-07 one a query head above 2,048 tokens: the split)
        nbh, walk = bh // group, group
        bwd = {(h, k): walk * (t - 128 * k) // 64 for h in range(nbh) for k in range(nb)}
        kv = max(1, (24 << 20) // (t * d * 4))  # fa3_tile_group's rule
        g = min(bh, kv * group)
        lpt = sorted(fwd, key=lambda b: -fwd[b])
        print(f"| {bh} | {t} | {d} | {makespan(in_groups(bh, nq, 1), fwd):.3f} | "
              f"{makespan(in_groups(bh, nq, g), fwd):.3f} ({g}) | {makespan(lpt, fwd):.3f} | "
              f"{makespan(in_groups(nbh, nb, 1), bwd):.3f} | "
              f"{makespan(in_groups(nbh, nb, 8, up=True), bwd):.3f} | "
              f"{makespan([(h, k) for k in range(nb) for h in range(nbh)], bwd):.3f} |")
