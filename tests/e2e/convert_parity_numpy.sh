#!/usr/bin/env bash
# convert_parity_numpy: moe's forward against an independent NumPy implementation of
# Hugging Face's Mixtral (tests/interop/np_mixtral.py) run on the exported directory:
# hidden states of every layer (moe-embed --per-token --layer L) and the logits agree to
# 1e-4 relative, and the exported tokenizer.json gives moe's token ids. The PyTorch +
# transformers version of this check is tests/interop/hf_parity.py (GPU machine).
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh"
if [ -z "$PY" ]; then echo "SKIP: no python3 with numpy (apt install python3-numpy)"; exit 77; fi
moe-convert -q to-hf "$CKPT" hf
SEQ=ACGTTGCAGGCATTACGATCGATCGNNACGTACGTTTGACCAGTacgtRYACGGT
printf '>s\n%s\n' "$SEQ" > s.fa
args=()
for l in 0 1 2; do
    moe-embed -q --device cpu -m "$CKPT" --per-token --layer "$l" s.fa > "l$l.tsv"
    args+=("$l:l$l.tsv")
done
"$PY" "$INTEROP/np_mixtral.py" hf "$SEQ" "${args[@]}" --tol 1e-4
# bf16 export: the reference on bf16 weights stays close to moe's f32 forward
moe-convert -q to-hf "$CKPT" hf_bf16 --dtype bf16
"$PY" "$INTEROP/np_mixtral.py" hf_bf16 "$SEQ" "2:l2.tsv" --tol 0.05
echo "convert_parity_numpy: ok"
