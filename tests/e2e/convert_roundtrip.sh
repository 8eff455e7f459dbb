#!/usr/bin/env bash
# convert_roundtrip: moe-convert on a tiny trained checkpoint - native -> HF -> native is
# bit-identical (f32, single file and sharded), the export passes a strict pure-Python
# safetensors/index/config check, the HF tokenizer.json tokenizes like moe (nuc, kmer,
# byte), the fused
# expert layout imports to the same weights, bf16 export, inspect (of a checkpoint and of
# a run directory), and bad input
# (non-Mixtral config, truncated file, missing tensor, tokenizer of another vocabulary,
# damaged checkpoint) each fails with exit 2 and a message.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
PYS=$(command -v /usr/bin/python3 || command -v python3)
CHK="$PYS $INTEROP/check_hf_export.py"
ST="$PYS $INTEROP/st_tool.py"

moe-convert -q to-hf "$CKPT" hf
$CHK layout hf
moe-convert -q to-hf run hf_sharded --max-shard-size 20KB
$CHK layout hf_sharded
[ "$(ls hf_sharded/model-*-of-*.safetensors | wc -l)" -gt 1 ] || { echo "FAIL: not sharded"; exit 1; }
moe-convert -q to-hf "$CKPT" hf_bf16 --dtype bf16
$CHK layout hf_bf16
grep -q '"torch_dtype": "bfloat16"' hf_bf16/config.json
grep -q '"dtype": "bfloat16"' hf_bf16/config.json && grep -q '"dtype": "float32"' hf/config.json
# transformers_version, generation_config.json with the config's special ids, a model card
grep -q '"transformers_version": "[0-9]*\.[0-9]*\.[0-9]*"' hf/config.json
"$PY" - <<'PY'
import json
c, g = json.load(open("hf/config.json")), json.load(open("hf/generation_config.json"))
for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
    assert g.get(k) == c[k], (k, g, c)
assert g["transformers_version"] == c["transformers_version"]
card = open("hf/README.md").read()
assert card.startswith("---\nlibrary_name: transformers\n"), card[:80]
for want in ("| tokenizer | `nuc`, 40 tokens", "| training data | `run.mtok` |", "| steps | 2 (",
             "(`bits_per_base`) |", "moe-train -q -c ", "moe-convert -q to-hf run/ckpt-00000002 hf\n"):
    assert want in card, (want, card)
PY

# native -> HF -> native: same tensor bytes, same config and tokenizer files
$CHK same "$CKPT" hf
moe-convert -q from-hf hf back
moe-convert -q from-hf hf_sharded back_sharded
$CHK same "$CKPT" back
$CHK same "$CKPT" back_sharded
cmp "$CKPT/config.yaml" back/config.yaml
cmp "$CKPT/tokenizer.json" back/tokenizer.json
# ... and the imported checkpoint embeds exactly like the original
printf '>x\nACGTNacgtnRYKMAAGGTTCCU\n>y\nGATTACAGATTACA\n' > q.fa
moe-embed -q -m "$CKPT" q.fa > orig.tsv
moe-embed -q -m back q.fa > back.tsv
cmp orig.tsv back.tsv

# an import holds weights only; training from it starts AdamW from zero moments, exactly
# as from the same checkpoint given an explicit optimizer file of zeros
[ ! -e back/optimizer-rank0.safetensors ] || { echo "FAIL: from-hf wrote optimizer state"; exit 1; }
moe-convert inspect back > inspect_back.txt
grep -q "weights only" inspect_back.txt || { echo "FAIL: inspect does not say weights only"; exit 1; }
cp -r back zeros
$ST zero-moments zeros
for from in back zeros; do
    moe-train -q -c back/config.yaml --data run.mtok -o "cont_$from" --resume "$from" \
        train.steps=2 checkpoint.every=0 train.eval_every=0 >/dev/null
done
cmp cont_back/ckpt-00000002/model.safetensors cont_zeros/ckpt-00000002/model.safetensors
cmp cont_back/ckpt-00000002/optimizer-rank0.safetensors cont_zeros/ckpt-00000002/optimizer-rank0.safetensors

# the exported tokenizer.json gives moe's token ids (checked through the layer-0 rows)
moe-embed -q -m "$CKPT" --per-token --layer 0 <(printf '>x\nACGTNacgtnRYKMAAGGTTCCU\n') > l0.tsv
$CHK tokens hf ACGTNacgtnRYKMAAGGTTCCU l0.tsv

# ... also for the kmer tokenizer (k-mers, single-base leftovers, N alone, case and IUPAC
# normalised) and the byte tokenizer
tiny_train run_kmer -t kmer -k 3
tiny_train run_byte -t byte
KSEQ=ACGTACGTTNACGGTAAcgtaRYTTGCAAGTC
printf '>k\n%s\n' "$KSEQ" > k.fa
for kind in kmer byte; do
    moe-convert -q to-hf "run_$kind" "hf_$kind"
    $CHK layout "hf_$kind"
    moe-embed -q -m "run_$kind" --per-token --layer 0 k.fa > "l0_$kind.tsv"
    $CHK tokens "hf_$kind" "$KSEQ" "l0_$kind.tsv"
done
grep -q '"\[ACGT\]{3}|."' hf_kmer/tokenizer.json

# fused gate_up_proj/down_proj layout (mlp. names) imports to the same weights
$ST fuse hf hf_fused
moe-convert -q from-hf hf_fused back_fused
$CHK same "$CKPT" back_fused
# bf16 import: converted to f32
moe-convert -q from-hf hf_bf16 back_bf16
moe-embed -q -m back_bf16 q.fa > /dev/null

# inspect: config, tokenizer, tensors, MANIFEST
moe-convert inspect "$CKPT" > inspect.txt
grep -q "MANIFEST: ok" inspect.txt
grep -q "model.layers.1.block_sparse_moe.experts.3.w2.weight" inspect.txt
grep -q "tokenizer: nuc, 40 tokens" inspect.txt
# ... of a run directory: its latest checkpoint, as every other tool takes it
moe-convert inspect run > inspect_run.txt
grep -q "^checkpoint run/ckpt-" inspect_run.txt || { echo "FAIL: inspect RUN/"; cat inspect_run.txt; exit 1; }
grep -q "MANIFEST: ok" inspect_run.txt
grep -q "model.layers.1.block_sparse_moe.experts.3.w2.weight" inspect_run.txt

expect_fail() { # expect_fail PATTERN CMD...
    local pat=$1; shift
    set +e; "$@" > out.txt 2> err.txt; local rc=$?; set -e
    if [ $rc -ne 2 ] || ! grep -q "$pat" err.txt; then
        echo "FAIL: '$*' gave exit $rc, stderr:"; cat err.txt; exit 1
    fi
}
# a config that is not Mixtral
cp -r hf hf_llama
sed -i 's/"mixtral"/"llama"/; s/MixtralForCausalLM/LlamaForCausalLM/' hf_llama/config.json
expect_fail "not Mixtral" moe-convert from-hf hf_llama bad1
# a truncated safetensors file
cp -r hf hf_trunc
head -c 100000 hf/model.safetensors > hf_trunc/model.safetensors
expect_fail "model.safetensors" moe-convert from-hf hf_trunc bad2
# a missing tensor
cp -r hf hf_missing
$ST drop hf/model.safetensors model.layers.1.block_sparse_moe.experts.2.w3.weight \
    hf_missing/model.safetensors
expect_fail "missing tensor 'model.layers.1.block_sparse_moe.experts.2.w3.weight'" \
    moe-convert from-hf hf_missing bad3
# a tokenizer of another vocabulary
expect_fail "vocab_size is 40" moe-convert from-hf --tokenizer byte hf bad4
[ ! -e bad1 ] && [ ! -e bad2 ] && [ ! -e bad3 ] && [ ! -e bad4 ]
# a damaged checkpoint: MANIFEST catches it, for to-hf and inspect
cp -r "$CKPT" damaged
printf 'x' | dd of=damaged/model.safetensors bs=1 seek=5000 conv=notrunc 2>/dev/null
expect_fail "model.safetensors" moe-convert to-hf damaged bad5
expect_fail "model.safetensors" moe-convert inspect damaged
[ ! -e bad5 ]
# an existing output is never overwritten
expect_fail "exists" moe-convert to-hf "$CKPT" hf
echo "convert_roundtrip: ok"
