#!/usr/bin/env python3
"""attn_reuse.py: how often the Hopper attention backward's step finds its query tiles still
in L2, by a simulation of the grid's dispatch (attn_tail.py's: blocks in launch order to the
SM that frees first, one query step a unit of time). A step of key block kb at query block qb
reads qb's Q and dO tiles and adds into its dQ tile (bytes B_STEP); the next visit of the same
(head, qb) by another key block finds them in L2 if the traffic of all SMs in between is less
than L2's size (an LRU cache, by stack distance approximated as time x traffic rate). Prints,
for each shape, the share of visits that would hit and the spread of the running blocks'
positions.

    /usr/bin/python3 bench/kernels/attn_reuse.py [SMS] [L2_MB]   (default 132, 50)

No GPU needed; a model, not a measurement: ncu's lts__t_sector_hit_rate.pct says what the
kernel really gets."""
import heapq
import sys

import numpy as np

sms = int(sys.argv[1]) if len(sys.argv) > 1 else 132
l2 = (float(sys.argv[2]) if len(sys.argv) > 2 else 50.0) * 2**20
D = 128
B_STEP = 64 * D * (2 + 2 + 4 + 4)  # Q and dO bf16 read; dQ fp32 read and written (reduce)


def run(B, H, T, split=True):
    nb = T // 128
    nq = T // 64
    # grid: key blocks of a head last first, heads in turn (the kernel's order when split)
    free = [(0.0, i) for i in range(sms)]
    heapq.heapify(free)
    starts = np.zeros((B * H, nb))
    for bh in range(B * H):
        for x in range(nb):
            kb = nb - 1 - x
            t, i = heapq.heappop(free)
            starts[bh, kb] = t
            heapq.heappush(free, (t + (nq - 2 * kb), i))
    rate = sms * B_STEP  # bytes of traffic a unit of time, all SMs busy
    hits = visits = 0
    for bh in range(B * H):
        # visit time of (kb, qb) = start[kb] + (qb - 2 kb), qb >= 2 kb
        for qb in range(nq):
            kbs = np.arange(0, qb // 2 + 1)
            times = np.sort(starts[bh, kbs] + (qb - 2 * kbs))
            gaps = np.diff(times) * rate
            hits += int(np.sum(gaps < l2))
            visits += len(times)
    return hits / visits


for (B, H, T) in [(2, 16, 8192), (2, 32, 4096), (1, 16, 32768), (1, 16, 131072)]:
    print(f"B{B} H{H} T{T} D{D}: predicted L2 hits of the query tiles {100 * run(B, H, T):.0f}%")
