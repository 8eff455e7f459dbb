#!/usr/bin/env python3
"""attn_turns.py: a step-level model of the Hopper attention backward's deterministic dQ turns
(kernels/sm90/attention_wgmma_bwd.cu), in two block orders: the kernel's until 06b11fb (each
head's key blocks last first, each block walking its query blocks up from its diagonal; dQ
added last key block first) and the longest-first one of commit 3ce6ee1 (reverted by bf5393b;
the first key blocks of all heads first, each block walking its query blocks down to its
diagonal, a block's query heads in turn at each; dQ added first key block first). On an H100
(2026-12-07) 3ce6ee1 made the backward take 49% longer at T8192 where this model has it within
1% of the ideal: a tick per link understates the waits. The kernel since 06b11fb goes longest
first too, but 8 (batch, kv head) rows in turn and without the split (attn_tail.py models its
grid); its dQ turns are the second order's, first key block first.

Blocks start in launch order on SMS slots; a block does one 64-query step a tick if the tile's
semaphore has reached its `want`, the adds of a tick seen in the next (a wait of one step a
link of a chain, more than the add's latency). It checks what the kernel relies on: no block
waits for a block that has not started (no deadlock), and each tile's adders come in key-block
order with want 0, 1, ... (the want: until 06b11fb q0 / 128 - kb; longest first kb minus the
key block of the tile's first row's document start) - with document masks too. Prints the
ticks against the ideal (steps / SMS) and the steps lost waiting for a turn.

    python3 bench/kernels/attn_turns.py [SMS]      (default 132)

No GPU needed; per-step costs are taken equal (a block's K/V load and dK/dV adds left out)."""
import random
import sys

sms = int(sys.argv[1]) if len(sys.argv) > 1 else 132


def doc_starts(B, T, docs, rnd):
    """dstart [B][T]: each row's document start, docs random boundaries a sequence"""
    out = []
    for _ in range(B):
        cuts = sorted({0} | {rnd.randrange(1, T) for _ in range(docs)})
        row, j = [], 0
        for q in range(T):
            while j + 1 < len(cuts) and cuts[j + 1] <= q:
                j += 1
            row.append(cuts[j])
        out.append(row)
    return out


def blocks_of(B, T, H, KV, dstart, longest_first):
    """each block's steps in launch order: (tile key, want, kb)"""
    group = H // KV
    nh = 1 if dstart is None and H > KV and T > 2048 else group  # fb_launch's split
    nb, nby = (T + 127) // 128, B * (H // nh)
    out = []
    for L in range(nb * nby):
        kb, by = (L // nby, L % nby) if longest_first else (nb - 1 - L % nb, L // nb)
        b, h0, k0 = by // (H // nh), by % (H // nh) * nh, kb * 128
        k_last = min(k0 + 128, T) - 1  # fa_query_end: the end of k_last's document
        q_end = T if dstart is None else next(
            (q for q in range(k_last + 1, T) if dstart[b][q] > k_last), T)
        nqt = (q_end - k0 + 63) // 64
        steps = []
        for i in range(nqt * nh):
            if longest_first:
                head, q0 = h0 + i % nh, k0 + (nqt - 1 - i // nh) * 64
                want = kb - (dstart[b][q0] // 128 if dstart else 0)
            else:
                head, q0 = h0 + i // nqt, k0 + (i % nqt) * 64
                want = q0 // 128 - kb
            steps.append(((b, head, q0 // 64), want, kb))
        out.append(steps)
    return out


def run(blocks, longest_first):
    adders = {}
    for steps in blocks:
        for key, want, kb in steps:
            adders.setdefault(key, []).append((kb if longest_first else -kb, want))
    for key, got in adders.items():  # the adders in dQ order must count 0, 1, ...
        got.sort()
        assert [w for _, w in got] == list(range(len(got))), f"tile {key}: {got}"
    sem, pos, nxt, res, ticks, lost = {}, [0] * len(blocks), 0, [], 0, 0
    while nxt < len(blocks) or res:
        while len(res) < sms and nxt < len(blocks):
            res.append(nxt)
            nxt += 1
        adds, moved = [], False
        for r in list(res):
            if pos[r] < len(blocks[r]):
                key, want, _ = blocks[r][pos[r]]
                if sem.get(key, 0) == want:
                    adds.append(key)
                    pos[r] += 1
                    moved = True
                else:
                    lost += 1
            if pos[r] == len(blocks[r]):
                res.remove(r)
                moved = True
        if not moved:
            sys.exit("attn_turns.py: DEADLOCK (a block waits for one that has not started)")
        for key in adds:
            sem[key] = sem.get(key, 0) + 1
        ticks += 1
    return ticks, -(-sum(len(s) for s in blocks) // sms), lost


rnd = random.Random(1)
print(f"ticks over the ideal on {sms} SMs, and steps lost waiting for a dQ turn")
print("| B H KV T, documents | until 06b11fb | longest first (3ce6ee1) |")
print("|---|---|---|")
for B, T, H, KV, docs in [(2, 8192, 16, 8, 0), (2, 4096, 32, 8, 0), (4, 2048, 16, 8, 0),
                          (1, 32768, 16, 8, 0), (2, 8192, 16, 8, 8), (2, 2400, 4, 2, 5),
                          (4, 700, 12, 4, 6), (1, 333, 4, 2, 0), (3, 200, 8, 2, 2)]:
    ds = doc_starts(B, T, docs, rnd) if docs else None
    row = []
    for lf in (False, True):
        t, ideal, lost = run(blocks_of(B, T, H, KV, ds, lf), lf)
        row.append(f"{t / ideal:.3f} ({lost} lost)")
    print(f"| {B} {H} {KV} {T}, {docs} | {row[0]} | {row[1]} |")
