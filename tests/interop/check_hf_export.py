#!/usr/bin/env python3
"""check_hf_export: validates a `moe-convert to-hf` directory with nothing but the Python
standard library (json + struct), the way a strict safetensors loader would.

  check_hf_export.py layout HF_DIR
      config.json is a MixtralConfig (keys, architectures, model_type, torch_dtype);
      every *.safetensors file: 8-byte header length, JSON header, known dtypes,
      data_offsets contiguous from 0, non-overlapping, covering the data area exactly,
      numel x dtype size = bytes, data area 8-byte aligned, dtype = torch_dtype;
      the index (when sharded): weight_map names exactly the tensors of each shard and
      metadata.total_size is their sum; the tensor names and shapes are exactly the
      Hub Mixtral names the config implies (no missing, no unexpected).
  check_hf_export.py same A B
      A and B (checkpoint dirs, HF dirs or .safetensors files) hold the same tensors
      with bit-identical bytes (dtype and shape too).
  check_hf_export.py tokens HF_DIR SEQUENCE LAYER0_TSV
      tokenizes SEQUENCE as the exported tokenizer.json says (normalizer Replace rules,
      Split pre-tokenizer regex, WordLevel vocabulary) and checks that the rows of
      `moe-embed --per-token --layer 0` (TSV) are the embedding rows of those ids, i.e.
      that Hugging Face and moe tokenize the sequence identically.
Exit 0 when everything holds; a message and exit 1 otherwise.
"""
import json
import os
import re
import struct
import sys

DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2,
              "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}


def fail(msg):
    print("check_hf_export: FAIL: " + msg)
    sys.exit(1)


def read_safetensors(path):
    """Returns ({name: (dtype, shape, bytes)}, metadata) after validating the layout."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8 or n > 100_000_000:
        fail(f"{path}: header length {n} runs past the file")
    if (8 + n) % 8:
        fail(f"{path}: data area starts at {8 + n}, not 8-byte aligned")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = []
    tensors = {}
    for name, t in header.items():
        if set(t) != {"dtype", "shape", "data_offsets"}:
            fail(f"{path}: tensor {name} has keys {sorted(t)}")
        if t["dtype"] not in DTYPE_SIZE:
            fail(f"{path}: tensor {name} has unknown dtype {t['dtype']}")
        b, e = t["data_offsets"]
        numel = 1
        for d in t["shape"]:
            numel *= d
        if e - b != numel * DTYPE_SIZE[t["dtype"]] or b < 0 or e > len(data):
            fail(f"{path}: tensor {name} offsets {b}..{e} do not fit shape {t['shape']}")
        spans.append((b, e, name))
        tensors[name] = (t["dtype"], list(t["shape"]), data[b:e])
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            fail(f"{path}: tensor {name} starts at {b}, expected {pos} (gap or overlap)")
        pos = e
    if pos != len(data):
        fail(f"{path}: {len(data) - pos} bytes after the last tensor")
    return tensors, meta


def load_dir(path):
    """All tensors of a checkpoint/HF directory or one .safetensors file."""
    if os.path.isfile(path):
        return read_safetensors(path)[0]
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors") and not f.startswith("optimizer"):
            for k, v in read_safetensors(os.path.join(path, f))[0].items():
                if k in out:
                    fail(f"{path}: tensor {k} appears in two files")
                out[k] = v
    return out


def expected(cfg):
    L, E = cfg["num_hidden_layers"], cfg["num_local_experts"]
    V, C, F = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    kv = C // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    names = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    if not cfg["tie_word_embeddings"]:
        names["lm_head.weight"] = [V, C]
    for i in range(L):
        p = f"model.layers.{i}."
        names[p + "input_layernorm.weight"] = [C]
        names[p + "post_attention_layernorm.weight"] = [C]
        names[p + "self_attn.q_proj.weight"] = [C, C]
        names[p + "self_attn.k_proj.weight"] = [kv, C]
        names[p + "self_attn.v_proj.weight"] = [kv, C]
        names[p + "self_attn.o_proj.weight"] = [C, C]
        names[p + "block_sparse_moe.gate.weight"] = [E, C]
        for j in range(E):
            names[p + f"block_sparse_moe.experts.{j}.w1.weight"] = [F, C]
            names[p + f"block_sparse_moe.experts.{j}.w2.weight"] = [C, F]
            names[p + f"block_sparse_moe.experts.{j}.w3.weight"] = [F, C]
    return names


def cmd_layout(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    if cfg.get("model_type") != "mixtral" or cfg.get("architectures") != ["MixtralForCausalLM"]:
        fail("config.json is not a MixtralForCausalLM config")
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "num_local_experts",
              "num_experts_per_tok", "max_position_embeddings", "rope_theta", "rms_norm_eps",
              "tie_word_embeddings", "router_aux_loss_coef", "torch_dtype"):
        if k not in cfg:
            fail(f"config.json lacks {k}")
    want_dtype = {"float32": "F32", "bfloat16": "BF16"}[cfg["torch_dtype"]]
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    index_path = os.path.join(d, "model.safetensors.index.json")
    per_file = {f: read_safetensors(os.path.join(d, f)) for f in files}
    for f, (_, meta) in per_file.items():
        if meta.get("format") != "pt":
            fail(f"{f}: __metadata__.format is {meta.get('format')!r}, transformers wants 'pt'")
    if os.path.exists(index_path):
        index = json.load(open(index_path))
        wm = index["weight_map"]
        total = 0
        for f, (tensors, _) in per_file.items():
            if not re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f):
                fail(f"unexpected file {f} next to an index")
            for name, (_, _, b) in tensors.items():
                if wm.get(name) != f:
                    fail(f"index maps {name} to {wm.get(name)}, it is in {f}")
                total += len(b)
        if len(wm) != sum(len(t) for t, _ in per_file.values()):
            fail("the index names tensors that are in no shard")
        if index["metadata"]["total_size"] != total:
            fail(f"index total_size {index['metadata']['total_size']} != {total}")
    elif files != ["model.safetensors"]:
        fail(f"expected model.safetensors (no index), found {files}")
    tensors = {}
    for t, _ in per_file.values():
        tensors.update(t)
    want = expected(cfg)
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        fail(f"missing tensors {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in want.items():
        dt, sh, _ = tensors[name]
        if sh != shape or dt != want_dtype:
            fail(f"{name}: {dt} {sh}, expected {want_dtype} {shape}")
    print(f"check_hf_export: ok: {d}: {len(tensors)} tensors in {len(files)} file(s), "
          f"{want_dtype}, layout and index valid")


def cmd_same(a, b):
    ta, tb = load_dir(a), load_dir(b)
    if set(ta) != set(tb):
        fail(f"tensor names differ: {sorted(set(ta) ^ set(tb))[:5]}")
    for k in ta:
        if ta[k] != tb[k]:
            fail(f"tensor {k} differs ({ta[k][0]} {ta[k][1]} vs {tb[k][0]} {tb[k][1]})")
    print(f"check_hf_export: ok: {len(ta)} tensors bit-identical in {a} and {b}")


def hf_tokenize(tok, seq):
    """The exported tokenizer.json applied by hand: normalizer, Split regex, vocabulary."""
    norm = tok["normalizer"]
    rules = norm["normalizers"] if norm else []
    for r in rules:
        assert r["type"] == "Replace"
        if "String" in r["pattern"]:
            seq = seq.replace(r["pattern"]["String"], r["content"])
        else:
            seq = re.sub(r["pattern"]["Regex"], r["content"], seq)
    pre = tok["pre_tokenizer"]
    assert pre["type"] == "Split" and pre["behavior"] == "Isolated", pre
    pieces = re.findall(pre["pattern"]["Regex"], seq)  # leftmost-first, like Rust's regex
    vocab = tok["model"]["vocab"]
    unk = vocab[tok["model"]["unk_token"]]
    return [vocab.get(p, unk) for p in pieces]


def f32(b):
    return list(struct.unpack(f"<{len(b) // 4}f", b))


def cmd_tokens(d, seq, tsv):
    tok = json.load(open(os.path.join(d, "tokenizer.json")))
    ids = hf_tokenize(tok, seq)
    tensors = load_dir(d)
    dt, (V, C), raw = tensors["model.embed_tokens.weight"]
    if dt != "F32":
        fail("use an f32 export for the token check")
    emb = f32(raw)
    rows = [line.rstrip("\n").split("\t")[2:] for line in open(tsv)]
    if len(rows) != len(ids):
        fail(f"Hugging Face gives {len(ids)} tokens for the sequence, moe {len(rows)}")
    for i, (tid, row) in enumerate(zip(ids, rows)):
        want = emb[tid * C:(tid + 1) * C]
        got = [float(v) for v in row]
        if any(abs(g - w) > 1e-6 * max(1.0, abs(w)) for g, w in zip(got, want)):
            fail(f"token {i} (HF id {tid}) is not moe's token")
    print(f"check_hf_export: ok: tokenizer.json gives moe's {len(ids)} token ids for the sequence")


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    cmd = sys.argv[1]
    if cmd == "layout":
        cmd_layout(sys.argv[2])
    elif cmd == "same":
        cmd_same(sys.argv[2], sys.argv[3])
    elif cmd == "tokens":
        cmd_tokens(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
