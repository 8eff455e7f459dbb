#!/usr/bin/env python3
"""check_npy: moe-embed's .npy + .ids.tsv against its TSV text output, with NumPy.

Usage: check_npy.py EMB.npy EMB.TSV MODE [DTYPE]
  MODE: pooled | per-window | per-token;  DTYPE: f32 (default) | f16

Checks that numpy.load reads the file (format 1.0, C order), that dtype and shape are what
the ids table says ([sequences | windows | tokens, hidden]), that the ids table is
consistent (its first line the @PG provenance line, row numbers, unique ids, BED intervals
with start <= end and a strand, windows, first_row offsets, the per-token offsets table one
line per .npy row, inside its sequence's interval), and that every value equals the TSV
text output of the same run exactly (the TSV prints 9 significant digits, exact for f32).
Exit 0 when all hold; a message and exit 1 otherwise.
"""
import sys

import numpy as np


def fail(msg):
    print("check_npy: FAIL: " + msg)
    sys.exit(1)


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    npy_path, tsv_path, mode = sys.argv[1:4]
    dtype = sys.argv[4] if len(sys.argv) > 4 else "f32"
    arr = np.load(npy_path, allow_pickle=False)
    want = np.float16 if dtype == "f16" else np.float32
    if arr.dtype != want:
        fail(f"dtype {arr.dtype}, expected {np.dtype(want)}")
    if arr.ndim != 2 or not arr.flags["C_CONTIGUOUS"]:
        fail(f"expected a 2-D C-order array, got shape {arr.shape}")
    with open(npy_path, "rb") as f:
        head = f.read(10)
        hlen = head[8] | head[9] << 8
        if head[:8] != b"\x93NUMPY\x01\x00" or (10 + hlen) % 64:
            fail("header is not version 1.0 with 64-byte aligned data")

    ids_path = npy_path[:-4] + ".ids.tsv" if npy_path.endswith(".npy") else npy_path + ".ids.tsv"
    with open(ids_path) as f:
        prov = f.readline().rstrip("\n").split("\t")
        header = f.readline().rstrip("\n").split("\t")
        ids = [line.rstrip("\n").split("\t") for line in f]
    if prov[:2] != ["#@PG", "ID:moe-embed"] or not any(p.startswith("VN:") for p in prov) \
            or not any(p.startswith("DS:checkpoint ") for p in prov):
        fail(f"ids table's first line is not the @PG provenance line: {prov}")
    col = {name: i for i, name in enumerate(header)}
    for need in ("row", "id", "name", "chrom", "start", "end", "strand", "bases", "tokens"):
        if need not in col:
            fail(f"ids table lacks column {need}: {header}")
    if len({r[col["id"]] for r in ids}) != len(ids):
        fail("ids table has duplicate ids")
    for r in ids:
        if not 0 <= int(r[col["start"]]) <= int(r[col["end"]]) or r[col["strand"]] not in "+-":
            fail(f"ids line {r}: not a BED interval with a strand")

    text = [line.rstrip("\n").split("\t") for line in open(tsv_path)]
    lead = 1 if mode == "pooled" else 2
    tsv_vals = np.array([[float(v) for v in t[lead:]] for t in text], dtype=np.float64)
    if tsv_vals.shape != arr.shape:
        fail(f"TSV has shape {tsv_vals.shape}, the .npy {arr.shape}")

    if mode == "per-token":
        total = 0
        for i, r in enumerate(ids):
            if int(r[col["row"]]) != i or int(r[col["first_row"]]) != total:
                fail(f"ids line {i + 2}: row/first_row {r[col['row']]}/{r[col['first_row']]}, "
                     f"expected {i}/{total}")
            n = int(r[col["tokens"]])
            for j in range(n):
                t = text[total + j]
                if t[0] != r[col["name"]] or int(t[1]) != j:
                    fail(f"TSV line {total + j + 1} is {t[0]}:{t[1]}, expected "
                         f"{r[col['name']]}:{j}")
            total += n
        if total != arr.shape[0]:
            fail(f"ids table covers {total} token rows, the .npy has {arr.shape[0]}")
        with open(npy_path[:-4] + ".offsets.tsv") as f:
            if f.readline().rstrip("\n").split("\t") != \
                    ["row", "seq", "token", "chrom", "start", "end", "strand"]:
                fail("offsets table header")
            offs = [line.rstrip("\n").split("\t") for line in f]
        if len(offs) != arr.shape[0]:
            fail(f"offsets table has {len(offs)} lines, the .npy {arr.shape[0]} rows")
        for i, t in enumerate(offs):
            r = ids[int(t[1])]
            if int(t[0]) != i or t[3] != r[col["chrom"]] or t[6] != r[col["strand"]] or \
                    not int(r[col["start"]]) <= int(t[4]) < int(t[5]) <= int(r[col["end"]]):
                fail(f"offsets line {i + 2} ({t}) is not a token of {r}")
    else:
        if len(ids) != arr.shape[0]:
            fail(f"ids table has {len(ids)} rows, the .npy {arr.shape[0]}")
        for i, r in enumerate(ids):
            if int(r[col["row"]]) != i or r[col["name"]] != text[i][0]:
                fail(f"ids line {i + 2} ({r}) does not match TSV line {i + 1} ({text[i][0]})")
            if mode == "per-window" and int(r[col["window"]]) != int(text[i][1]):
                fail(f"ids line {i + 2}: window {r[col['window']]} vs TSV {text[i][1]}")

    # 9 significant digits identify an f32 exactly: compare as f32, bit for bit
    got = arr.astype(np.float32)
    tsv_vals = tsv_vals.astype(np.float32)
    if not np.isfinite(got).all():
        fail("non-finite values in the .npy")
    if not np.array_equal(got, tsv_vals):
        diff = np.abs(got - tsv_vals).max()
        fail(f"values differ from the TSV output (max abs difference {diff:g})")
    print(f"check_npy: ok: {npy_path} {arr.dtype} {arr.shape} equals {tsv_path} ({mode})")


if __name__ == "__main__":
    main()
