#!/usr/bin/env bash
# bench/kernels/run_playgrounds.sh: build and run the kernel playgrounds of this folder in one
# GPU call, each under a time limit (a playground kernel that deadlocks must not eat the
# call), one log each under OUT_DIR. Each playground checks its own kernels before it prints
# a rate (a FAIL line means the kernel is wrong and its rate is not printed).
#
#   bench/kernels/run_playgrounds.sh [OUT_DIR] [NAME ...]    (defaults: $OUT or ./playgrounds;
#                                                             grouped_gemm grouped_fp8 mxfp8_quant)
#
# Known names: grouped_gemm, grouped_fp8, mxfp8_quant (the default list).
#
# Run from the checkout's root on the GPU machine (needs nvcc and cuBLASLt; no .deps). They
# compile at once, then run one after the other (each wants the whole GPU), each under
# LIMIT_S seconds (default 80; grouped_gemm's fwd, dgrad and wgrad parts each, grouped_fp8's
# fwd and wgrad). Exit status
# 1 when a build failed, a playground exited non-zero, ran past its limit or printed
# a FAIL line (grouped_gemm reports a failed check that way and still exits 0).
set -uo pipefail
out=${1:-${OUT:-playgrounds}}
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(grouped_gemm grouped_fp8 mxfp8_quant)
limit=${LIMIT_S:-80}
mkdir -p "$out"
flags="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ilibcore/include -Ilibcore/src -Ikernels"
for n in "${names[@]}"; do
    rm -f "/tmp/pg_$n"
    extra=""
    if [ "$n" = mxfp8_quant ]; then
        # its reference is the CPU emulation itself: libcore's quant.c, built by gcc (OpenMP)
        gcc -std=c11 -O2 -fopenmp -Ilibcore/include -c libcore/src/num/quant.c \
            -o /tmp/pg_quant.o > "$out/$n.log" 2>&1 || continue
        extra="-Xcompiler -fopenmp /tmp/pg_quant.o -lgomp"
    fi
    nvcc $flags -Xptxas -v "bench/kernels/$n.cu" $extra -lcublasLt -o "/tmp/pg_$n" \
        >> "$out/$n.log" 2>&1 &
done
wait
rc=0
for n in "${names[@]}"; do
    if [ ! -x "/tmp/pg_$n" ]; then
        echo "$n: build failed ($out/$n.log)"
        rc=1
        continue
    fi
    # grouped_gemm's three products and grouped_fp8's two run as processes of their own: a
    # hang in one hides no other
    parts=("")
    [ "$n" = grouped_gemm ] && parts=(fwd dgrad wgrad)
    [ "$n" = grouped_fp8 ] && parts=(fwd wgrad)
    for part in "${parts[@]}"; do
        echo "== $(date -u '+%H:%M:%S UTC') /tmp/pg_$n $part" >> "$out/$n.log"
        timeout "$limit" "/tmp/pg_$n" $part >> "$out/$n.log" 2>&1
        st=$?
        [ $st -eq 124 ] && echo "$n $part: ran past ${limit} s (a hang?)" >> "$out/$n.log"
        echo "$n $part: exit $st"
        [ $st -eq 0 ] || rc=1
    done
    fails=$(grep -c FAIL "$out/$n.log")
    echo "$n: $fails FAIL line(s)"
    [ "$fails" -eq 0 ] || rc=1
done
exit $rc
