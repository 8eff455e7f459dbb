#!/usr/bin/env bash
# stream_train.sh: tokenize and train in one pipe - no token shards are written to disk.
#
#   moe-tokenize GENOME -o - | moe-train -c CONFIG --data - -o RUN [key=value ...]
#
# moe-tokenize writes one shard stream to stdout; `moe-train --data -` reads it fully into
# memory, then trains exactly as from a file (same bytes -> same run). The one thing to know:
# a pipe carries no validation companion, so either pass a held-out shard with
# data.val_path=held_out.mtok or accept that no val_loss is reported.
#
# Usage: stream_train.sh [GENOME.fa[.gz]] [RUN_DIR] [key=value ...]
#   defaults: data/lambda_virus.fa.gz, stream-run/, then configs/tiny.yaml as it is.
# Example: pipelines/examples/stream_train.sh data/lambda_virus.fa.gz run-pipe train.steps=60
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ -n "${MOE_BUILD_DIR:-}" ] && PATH="$MOE_BUILD_DIR:$PATH"
[ -x "$src/build/moe-train" ] && PATH="$PATH:$src/build"
genome=${1:-$src/data/lambda_virus.fa.gz}
run=${2:-stream-run}
shift $(($# < 2 ? $# : 2))
config=${MOE_CONFIG:-$src/configs/tiny.yaml}

echo "\$ moe-tokenize $genome -o - | moe-train -c $config --data - -o $run $*" >&2
moe-tokenize "$genome" -o - | moe-train -c "$config" --data - -o "$run" "$@"
echo "run directory: $run (checkpoint $(cat "$run/latest"), metrics.jsonl, loss.svg)" >&2
