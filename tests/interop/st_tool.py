#!/usr/bin/env python3
"""st_tool: makes the variants of a Hugging Face Mixtral directory the convert tests need,
with the standard library only (json + struct).

  st_tool.py fuse SRC_DIR DST_DIR    copy of SRC_DIR (single model.safetensors) with the
        experts in the fused layout of newer transformers, under `mlp.` module names:
        model.layers.{l}.mlp.experts.gate_up_proj [E, 2F, C] = concat(w1_j, w3_j) per
        expert j, model.layers.{l}.mlp.experts.down_proj [E, C, F] = w2_j, and
        model.layers.{l}.mlp.gate.weight.
  st_tool.py drop FILE NAME OUT      FILE without tensor NAME, written to OUT.
  st_tool.py zero-moments CKPT_DIR   gives a weights-only checkpoint an optimizer-rank0 of
        zero Adam moments (<param>.exp_avg, .exp_avg_sq) and rewrites its MANIFEST.
read() is also imported by the e2e tests that look inside checkpoints.
The one thing to know: tensors are copied byte for byte, so importing the fused copy must
give bit-identical weights to importing the original.
"""
import binascii
import json
import os
import re
import shutil
import struct
import sys


def read(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}, meta


def write(path, tensors, meta):
    header, off, chunks = {}, 0, []
    for name in sorted(tensors):
        dt, shape, b = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    if meta is not None:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def fuse(src, dst):
    shutil.copytree(src, dst)
    tensors, meta = read(os.path.join(src, "model.safetensors"))
    out = {}
    layers = {}
    for name, t in tensors.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight", name)
        if m:
            layers.setdefault(int(m.group(1)), {})[(int(m.group(2)), m.group(3))] = t
            continue
        out[name.replace(".block_sparse_moe.", ".mlp.")] = t
    for layer, ex in layers.items():
        E = 1 + max(j for j, _ in ex)
        dt, (F, C), _ = ex[(0, "w1")]
        gate_up = b"".join(ex[(j, "w1")][2] + ex[(j, "w3")][2] for j in range(E))
        down = b"".join(ex[(j, "w2")][2] for j in range(E))
        p = f"model.layers.{layer}.mlp.experts."
        out[p + "gate_up_proj"] = (dt, [E, 2 * F, C], gate_up)
        out[p + "down_proj"] = (dt, [E, C, F], down)
    write(os.path.join(dst, "model.safetensors"), out, meta)


def drop(path, name, out):
    tensors, meta = read(path)
    del tensors[name]
    write(out, tensors, meta)


def zero_moments(d):
    tensors, meta = read(os.path.join(d, "model.safetensors"))
    zeros = {name + m: ("F32", shape, bytes(len(b)))
             for name, (_, shape, b) in tensors.items() for m in (".exp_avg", ".exp_avg_sq")}
    write(os.path.join(d, "optimizer-rank0.safetensors"), zeros, meta)
    lines = []
    for f in sorted(os.listdir(d)):
        if f != "MANIFEST":
            b = open(os.path.join(d, f), "rb").read()
            lines.append(f"{len(b)} {binascii.crc32(b) & 0xffffffff:08x} {f}\n")
    open(os.path.join(d, "MANIFEST"), "w").write("".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "fuse":
        fuse(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "drop":
        drop(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 3 and sys.argv[1] == "zero-moments":
        zero_moments(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)
