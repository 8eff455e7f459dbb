#!/usr/bin/env python3
"""attn_reuse.py: how often the Hopper attention backward's steps would find their query tiles
still in L2, and what its grid's tail costs, for block orders the kernel could use, by a
simulation of the dispatch (attn_tail.py's: blocks in launch order to the SM that frees first,
one query step a unit of time). A step of key block kb at query block qb reads qb's Q and dO
tiles and adds into its dQ tile (B_STEP bytes); the next visit of the same (head, qb) by another
key block finds them in L2 if the traffic of all SMs in between is less than L2's size (an LRU
cache, by stack distance approximated as time x traffic rate). Orders:
  old         each head's key blocks last first, head by head (the kernel's until 06b11fb):
              what its dQ turns needed (a key block added to a query block after every later
              key block had)
  groups 8    the same, 8 heads in turn at each key block (attn_tail.py's)
  free/head   longest first (first key block first), head by head: possible only where dQ's
              adds do not depend on their order (e.g. fixed-point sums)
  free/4      longest first, 4 heads in turn at each key block, the same condition
  free/all    longest first with all heads in turn, the same condition
Waits for dQ turns are left out (none in the old order; the free orders have no turns). The
grids are the split ones (a block a query head, T > 2048: fb_launch's rule without documents
until 2026-12-07).
Measured on an H100 (2026-12-07): ncu's L2 hit rate of k_fb_bwd at T131072 69% in the old
order (the model: 7%), 96% longest first with 4 heads in turn (97%); at T8192 94% / 93% (97%).
The kernel since runs longest first with 8 kv heads in turn and no split, dQ still in turns
(first key block first, each block walking its queries from the last): 3-17% faster.

    /usr/bin/python3 bench/kernels/attn_reuse.py [SMS] [L2_MB]   (default 132, 50)

No GPU needed; a model, not a measurement: ncu's lts__t_sector_hit_rate.pct on k_fb_bwd says
what the kernel really gets."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_tail import dispatch, in_groups, sms  # noqa: E402  (sms: argv[1] there too)

l2 = (float(sys.argv[2]) if len(sys.argv) > 2 else 50.0) * 2**20
B_STEP = 64 * 128 * (2 + 2 + 4 + 4)  # D128: Q, dO bf16 read; dQ fp32 read and written


def order(name, bh, nb):
    if name == "old":
        return in_groups(bh, nb, 1)
    if name == "groups 8":
        return in_groups(bh, nb, 8)
    g = {"free/head": 1, "free/4": 4, "free/all": bh}[name]
    return in_groups(bh, nb, g, up=True)  # the same, key blocks counting up


def run(name, bh, T):
    nb, nq = T // 128, T // 64
    length = {(h, kb): nq - 2 * kb for h in range(bh) for kb in range(nb)}
    od = order(name, bh, nb)
    start = dispatch(od, length)
    end = max(start[b] + length[b] for b in od)
    rate = sms * B_STEP  # bytes a unit of time, all SMs busy
    hits = visits = 0
    for h in range(bh):
        st = np.array([start[(h, kb)] for kb in range(nb)])
        for qb in range(nq):  # visit of (kb, qb) at start[kb] + qb - 2 kb, qb >= 2 kb
            kbs = np.arange(0, qb // 2 + 1)
            times = np.sort(st[kbs] + (qb - 2 * kbs))
            hits += int(np.sum(np.diff(times) * rate < l2))
            visits += len(times)
    return end / (sum(length.values()) / sms), hits / visits


names = ["old", "groups 8", "free/head", "free/4", "free/all"]
print(f"makespan / ideal and predicted L2 hits of the query tiles, {sms} SMs, L2 {l2 / 2**20:.0f} MB")
print("| B*H | T | " + " | ".join(names) + " |")
print("|---|---|" + "---|" * len(names))
for bh, T in [(32, 8192), (64, 4096), (16, 32768), (16, 131072)]:  # split grids (T > 2048)
    cells = [run(n, bh, T) for n in names]
    print(f"| {bh} | {T} | " + " | ".join(f"{m:.3f}, {100 * h:.0f}%" for m, h in cells) + " |")
