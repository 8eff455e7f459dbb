#!/usr/bin/env bash
# convert_reshard: moe-convert reshard --ep N / consolidate on a tiny trained checkpoint
# (4 experts). ep 2 and ep 4 and back give every file of the original byte for byte
# (4 -> 2 equals 1 -> 2); a pure-Python reader (json + struct) checks that each EP file
# holds exactly its rank's experts (global indices) with the original bytes, the index and
# the optimizer files; moe-embed, to-hf and moe-train --resume read the sharded checkpoint
# exactly like the original; inspect shows the layout; config overrides fix a config that
# N would make invalid; bad input (--ep not dividing E, missing shard, index naming a tensor
# twice or missing one, OUT_DIR exists, corrupted shard, ...) each fails with exit 2 and a
# message, leaving no output behind.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
PYS=$(command -v /usr/bin/python3 || command -v python3)

same_dirs() { # same_dirs A B: the same file names, every file byte-identical
    diff <(ls "$1") <(ls "$2") || fail "$1 and $2 hold different files"
    for f in $(ls "$1"); do
        [ "$f" = README.md ] && continue # names its checkpoint and command: card_same
        cmp "$1/$f" "$2/$f" || fail "$2/$f differs from $1/$f"
    done
}
card_same() { # card_same A B: model cards with one table but for the checkpoint id
    diff <(grep '^| ' "$1/README.md" | grep -v '^| checkpoint |') \
        <(grep '^| ' "$2/README.md" | grep -v '^| checkpoint |') || fail "$2/README.md"
}

# ---- round trips: every file byte-identical ----
moe-convert -q reshard --ep 2 "$CKPT" ep2
moe-convert -q reshard --ep 4 "$CKPT" ep4/ # a trailing slash names the same directory
moe-convert -q consolidate ep2 back2
moe-convert -q consolidate ep4/ back4/
same_dirs "$CKPT" back2
same_dirs "$CKPT" back4
moe-convert -q reshard --ep 2 ep4 ep4to2
same_dirs ep2 ep4to2
moe-convert -q consolidate ep4to2 back42
same_dirs "$CKPT" back42
moe-convert -q reshard --ep 1 ep2 back21 # --ep 1 is consolidate
same_dirs "$CKPT" back21
grep -q '^  ep: 2$' ep2/config.yaml || fail "ep2/config.yaml does not say parallel.ep 2"
[ "$(ls ep4/model-ep*-of-00004.safetensors | wc -l)" -eq 4 ] || fail "ep4: not 4 model files"
[ ! -e ep2/model.safetensors ] || fail "ep2 still has model.safetensors"
ls -d ./*.tmp.* 2>/dev/null && fail "temporary directories left behind"

# ---- the layout, checked by an independent reader ----
"$PYS" - "$CKPT" ep2 2 ep4 4 <<'EOF'
import json, os, re, sys
sys.path.insert(0, os.path.join(os.environ["MOE_SRC_DIR"], "tests", "interop"))
from st_tool import read  # {name: (dtype, shape, bytes)}, __metadata__

orig, ometa = read(os.path.join(sys.argv[1], "model.safetensors"))
oopt, oometa = read(os.path.join(sys.argv[1], "optimizer-rank0.safetensors"))
EXPERT = re.compile(r"model\.layers\.\d+\.block_sparse_moe\.experts\.(\d+)\.w[123]\.weight")
E = 1 + max(int(m.group(1)) for m in map(EXPERT.fullmatch, orig) if m)
assert E == 4, E
for d, ep in zip(sys.argv[2::2], map(int, sys.argv[3::2])):
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    assert idx["metadata"]["moe_ep"] == ep, idx["metadata"]
    assert idx["metadata"]["total_size"] == sum(len(t[2]) for t in orig.values())
    assert sorted(idx["weight_map"]) == sorted(orig), "index names differ from the model's"
    seen = set()
    for r in range(ep):
        f = "model-ep%05d-of-%05d.safetensors" % (r, ep)
        want = set()
        for name in orig:
            m = EXPERT.fullmatch(name)
            owner = int(m.group(1)) // (E // ep) if m else 0
            if owner == r:
                want.add(name)
        got, meta = read(os.path.join(d, f))
        assert set(got) == want, (f, sorted(set(got) ^ want))
        assert meta == ometa, (f, meta)
        for name, t in got.items():
            assert t == orig[name], (f, name, "bytes/shape/dtype differ")
            assert idx["weight_map"][name] == f, (name, idx["weight_map"][name])
        seen |= want
        opt, meta = read(os.path.join(d, "optimizer-rank%d.safetensors" % r))
        assert set(opt) == {n + s for n in want for s in (".exp_avg", ".exp_avg_sq")}, f
        assert meta == oometa
        for name, t in opt.items():
            assert t == oopt[name], (name, "moment bytes differ")
    assert seen == set(orig), "some tensor is in no EP file"
print("layout ok")
EOF

# ---- every reader takes the sharded checkpoint like the original ----
printf '>x\nACGTNacgtnRYKMAAGGTTCCU\n>y\nGATTACAGATTACA\n' > q.fa
moe-embed -q -m "$CKPT" q.fa > orig.tsv
moe-embed -q -m ep2 q.fa > ep2.tsv
moe-embed -q -m ep4 q.fa -o ep4.npy
moe-embed -q -m "$CKPT" q.fa -o orig.npy
cmp orig.tsv ep2.tsv || fail "moe-embed on ep2 differs"
cmp orig.npy ep4.npy || fail "moe-embed -o on ep4 differs"
moe-convert -q to-hf "$CKPT" hf_orig
moe-convert -q to-hf ep4 hf_ep4/
same_dirs hf_orig hf_ep4
card_same hf_orig hf_ep4
# a weights-only checkpoint (an import) stays weights only through reshard and consolidate
moe-convert -q from-hf hf_orig imported
moe-convert -q reshard --ep 2 imported imported_ep2
moe-convert -q consolidate imported_ep2 imported_back
ls imported_ep2 imported_back | grep -q optimizer && fail "reshard invented optimizer state"
cmp imported/model.safetensors imported_back/model.safetensors || fail "weights-only round trip differs"
moe-embed -q -m imported_ep2 q.fa > imported.tsv
cmp orig.tsv imported.tsv || fail "moe-embed on the resharded import differs"
moe-convert inspect ep2 > inspect.txt
grep -q "layout: expert-parallel, ep 2" inspect.txt || fail "inspect does not show the layout"
grep -q "rank 1: model-ep00001-of-00002.safetensors (experts 2-3, 12 tensors)" inspect.txt ||
    fail "inspect does not show rank 1's experts"
grep -q "MANIFEST: ok" inspect.txt || fail "inspect: MANIFEST"
moe-convert inspect "$CKPT" > inspect1.txt
grep -q "layout: single file (ep 1)" inspect1.txt || fail "inspect: single file"

# resume at world size 1 from the ep 4 checkpoint continues exactly like from the original
VOCAB=$(moe-tokenize stats --json run.mtok | sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' | awk 'NR == 1')
resume() { # resume RUN_DIR FROM
    moe-train -q -c "$MOE_SRC_DIR/configs/tiny.yaml" --data run.mtok -o "$1" --resume "$2" \
        train.steps=4 optim.warmup_steps=1 train.seq_len=128 train.global_batch_tokens=512 \
        model.hidden_size=32 model.intermediate_size=48 model.vocab_size="$VOCAB" \
        model.max_position_embeddings=256 checkpoint.every=0 log.every=1 train.eval_every=0 \
        >/dev/null
}
resume res_orig "$CKPT"
resume res_ep4 ep4
losses() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
[ "$(losses res_orig | wc -l)" -eq 2 ] || fail "resume: $(losses res_orig | wc -l) metrics lines"
diff <(losses res_orig) <(losses res_ep4) || fail "losses differ after resuming from ep4"
for f in model.safetensors optimizer-rank0.safetensors; do
    cmp res_orig/ckpt-00000004/$f res_ep4/ckpt-00000004/$f || fail "$f differs after resume"
done

# ---- config overrides: a parallel setting that N makes invalid is refused, then fixed ----
expect_fail() { # expect_fail PATTERN CMD...
    local pat=$1; shift
    set +e; "$@" > out.txt 2> err.txt; local rc=$?; set -e
    if [ $rc -ne 2 ] || ! grep -q -- "$pat" err.txt; then
        echo "FAIL: '$*' gave exit $rc, stderr:"; cat err.txt; exit 1
    fi
}
expect_fail "train.global_batch_tokens" moe-convert reshard --ep 2 "$CKPT" bad_cfg parallel.dp=4
grep -q "KEY=VALUE after OUT_DIR" err.txt || fail "no hint naming the override"
moe-convert -q reshard --ep 2 "$CKPT" dp4 parallel.dp=4 train.global_batch_tokens=1024
grep -q '^  dp: 4$' dp4/config.yaml || fail "override parallel.dp=4 not applied"
expect_fail "cannot change model.hidden_size" \
    moe-convert reshard --ep 2 "$CKPT" bad_model model.hidden_size=64

# ---- bad input: exit 2, a message naming the problem, nothing written ----
expect_fail "does not divide model.num_local_experts (4)" moe-convert reshard --ep 3 "$CKPT" bad1
grep -q "choose --ep from 1, 2, 4" err.txt || fail "no hint with the valid --ep values"
expect_fail "--ep expects a number" moe-convert reshard --ep 0 "$CKPT" bad2
expect_fail "reshard needs --ep" moe-convert reshard "$CKPT" bad3
expect_fail "already exists" moe-convert reshard --ep 2 "$CKPT" ep4
expect_fail "already exists" moe-convert consolidate ep2 back2
# a missing EP shard file
cp -r ep2 miss && rm miss/model-ep00001-of-00002.safetensors
expect_fail "model-ep00001-of-00002.safetensors" moe-convert consolidate miss bad4
expect_fail "model-ep00001-of-00002.safetensors" moe-embed -m miss q.fa
# a corrupted shard: MANIFEST's CRC catches it
cp -r ep2 corrupt
printf 'x' | dd of=corrupt/model-ep00001-of-00002.safetensors bs=1 seek=3000 conv=notrunc 2>/dev/null
expect_fail "model-ep00001-of-00002.safetensors.*CRC32" moe-convert consolidate corrupt bad5
expect_fail "CRC32" moe-convert to-hf corrupt bad6
# index edits with a consistent MANIFEST (as a careless tool would leave them)
edit_index() { # edit_index DIR PYTHON_EXPR_ON_TEXT: rewrites the index and its MANIFEST line
    "$PYS" - "$1" "$2" <<'EOF'
import os, sys, zlib
d, expr = sys.argv[1], sys.argv[2]
p = os.path.join(d, "model.safetensors.index.json")
text = eval(expr, {"t": open(p).read()})
open(p, "w").write(text)
lines = []
for line in open(os.path.join(d, "MANIFEST")):
    if line.startswith("#"):  # the first line (file count, CRC32): a careless tool drops it
        continue
    name = line.split(" ", 2)[2].rstrip("\n")
    blob = open(os.path.join(d, name), "rb").read()
    lines.append("%d %08x %s\n" % (len(blob), zlib.crc32(blob) & 0xffffffff, name))
open(os.path.join(d, "MANIFEST"), "w").write("".join(lines))
EOF
}
T=model.layers.1.block_sparse_moe.experts.3.w2.weight
cp -r ep2 twice
edit_index twice "t.replace('\"weight_map\": {', '\"weight_map\": {\n    \"$T\": \"model-ep00001-of-00002.safetensors\",', 1)"
expect_fail "duplicate object key" moe-convert consolidate twice bad7
cp -r ep2 nomap
edit_index nomap "t.replace('    \"$T\": \"model-ep00001-of-00002.safetensors\",\n', '', 1)"
expect_fail "weight_map has no file for tensor '$T'" moe-convert consolidate nomap bad8
cp -r ep2 wrongrank
edit_index wrongrank "t.replace('\"$T\": \"model-ep00001', '\"$T\": \"model-ep00000', 1)"
expect_fail "EP rank 1 owns it" moe-train -q -c "$MOE_SRC_DIR/configs/tiny.yaml" --data run.mtok \
    -o bad_res --resume wrongrank train.steps=4 optim.warmup_steps=1 train.seq_len=128 \
    train.global_batch_tokens=512 model.hidden_size=32 model.intermediate_size=48 \
    model.vocab_size="$VOCAB" model.max_position_embeddings=256
cp -r ep2 badjson
edit_index badjson "t[:-20]"
expect_fail "invalid index JSON" moe-convert inspect badjson
# config.yaml and the files disagree
cp -r ep2 mixed && cp "$CKPT/model.safetensors" mixed/
expect_fail "both model.safetensors and" moe-convert to-hf mixed bad9
for d in bad1 bad2 bad3 bad4 bad5 bad6 bad7 bad8 bad9 bad_cfg bad_model; do
    [ ! -e "$d" ] || fail "$d was written despite the error"
done
ls -d ./*.tmp.* 2>/dev/null && fail "temporary directories left behind"
echo "convert_reshard: ok"
