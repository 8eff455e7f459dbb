#!/usr/bin/env bash
# e2e.convert_model_type: moe-convert from-hf imports only Mixtral: a config.json whose
# model_type is another model is refused (exit 2) even when its architectures list says
# Mixtral; without a model_type, a Mixtral architecture is enough.
set -euo pipefail
source "$MOE_SRC_DIR/tests/interop/expect.sh" # fail, expect
source "$MOE_SRC_DIR/tests/interop/tiny_ckpt.sh" # trains ./run, sets CKPT and PY
[ -n "$PY" ] || { echo "SKIP: no python3"; exit 77; }
moe-convert -q to-hf "$CKPT" hf
edit() { # edit DIR PYTHON-STATEMENT: a copy of hf/ with config.json (as c) changed
  cp -r hf "$1"
  "$PY" -c "import json; p='$1/config.json'; c=json.load(open(p)); $2; json.dump(c, open(p, 'w'))"
}
edit llama "c['model_type'] = 'llama'"
expect 2 "describes a 'llama' model, not Mixtral" -- moe-convert from-hf llama out1
[ ! -e out1 ] || fail "a refused import left out1"
edit notype "del c['model_type']"
moe-convert -q from-hf notype out2 || fail "a Mixtral architecture without model_type was refused"
echo "ok: from-hf checks model_type"
