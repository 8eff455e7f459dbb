#!/usr/bin/env python3
"""attn_tail.py: how much of the Hopper attention kernels' time the grid's tail costs, by a
simulation: blocks of known lengths (key blocks a forward block multiplies, query steps a
backward block walks) handed in launch order to the SM that frees up first, as the hardware
dispatches them. Prints the makespan over the ideal (the total spread evenly) for the orders
the kernels could use: the forward's head by head (each head's blocks longest first: its grid
until 2026-12-07), in groups of G heads taking turns (fa3_tile_group's rule, its grid since:
+4% at T8192 on an H100) and longest first over all heads; the backward's head by head (its
grid: its dQ order, the last key block first, needs each head's key blocks shortest first), in
groups of 8 heads, and longest first with the heads in turn (the order of commit 3ce6ee1,
reverted by bf5393b: dQ added first key block first, each block walking its queries from the
last; the wait of a block for the adds of the blocks of its head started with it is left out
here, and on an H100 it made the backward take 49% longer at T8192: dropped 2026-12-07). The
backward's grids here are its split ones (a block a query head above 2,048 tokens); since
2026-12-07 it has no split and runs longest first with 8 kv heads in turn (3-17% faster on an
H100: with all heads in turn the blocks of a head lose L2, which this model does not count).

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


def in_groups(bh, nblk, g):
    """blocks (head, block) of g heads at a time, the heads in turn at each block index, the
    indices counting down (the forward's longest first, the backward's shortest)"""
    out = []
    for g0 in range(0, bh, g):
        gl = min(g, bh - g0)
        for j in range(gl * nblk):
            k = j // gl
            out.append((g0 + j % gl, nblk - 1 - k))
    return out


if __name__ == "__main__":
    # (B * H, T, GQA group, D): the op harness's perf shapes (tests/gpu/ops_perf.c)
    shapes = [(32, 8192, 2, 128), (64, 4096, 4, 128), (64, 2048, 2, 64), (16, 32768, 2, 128),
              (16, 131072, 2, 128)]
    print(f"makespan / ideal on {sms} SMs (1.000: no tail)")
    print("| B*H | T | D | fwd head by head | fwd groups (G) | fwd longest first | bwd head by head |"
          " bwd groups of 8 | bwd longest first |")
    print("|---|---|---|---|---|---|---|---|---|")
    for bh, t, group, d in shapes:
        nb = t // 128
        fwd = {(h, q): q + 1 for h in range(bh) for q in range(nb)}  # key blocks of 128 a tile
        # the backward's blocks: one a query head above 2,048 tokens (fb_launch's split), else one
        # a kv head walking its group's query heads; 64-query steps
        nbh, walk = (bh, 1) if t > 2048 else (bh // group, group)
        bwd = {(h, k): walk * (t - 128 * k) // 64 for h in range(nbh) for k in range(nb)}
        kv = max(1, (24 << 20) // (t * d * 4))  # fa3_tile_group's rule
        g = min(bh, kv * group)
        lpt = sorted(fwd, key=lambda b: -fwd[b])
        print(f"| {bh} | {t} | {d} | {makespan(in_groups(bh, nb, 1), fwd):.3f} | "
              f"{makespan(in_groups(bh, nb, g), fwd):.3f} ({g}) | {makespan(lpt, fwd):.3f} | "
              f"{makespan(in_groups(nbh, nb, 1), bwd):.3f} | {makespan(in_groups(nbh, nb, 8), bwd):.3f} | "
              f"{makespan([(h, k) for k in range(nb) for h in range(nbh)], bwd):.3f} |")
