"""grouped_torch.py: torch._grouped_mm (bf16) on the grouped products our op harness timed,
with the same shapes and the same expert counts, and one table of both with the ratio.

    python3 bench/grouped_torch.py OURS.txt

OURS.txt is the output of `gpu_test_backend_ops --perf --only "grouped bf16"` (bench/grouped_gpu.sh
runs both in one go): each forward case's line (name with M rows, I in, O out; time; TFLOP/s)
and the counts line under it. torch's product is x [M, I] by w [E, O, I] transposed, the
layout ../shared/anchors/anchors_turn2.py times; median of 20 timed calls after 5 warm-ups,
CUDA events. Prints a markdown table; exit 1 if a case could not be read or run."""
import re
import sys

import torch


def median_ms(fn, it=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(it):
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def cases(path):
    """(name, M, I, O, ours_ms, ours_tflops, counts) of each forward grouped case"""
    out, last = [], None
    case = re.compile(r"^\s+(grouped bf16 E(\d+) M(\d+) I(\d+) O(\d+)(?: uneven)?)\s+fwd\s+"
                      r"([0-9.]+) ms\s+([0-9.]+) TFLOP/s")
    for line in open(path):
        m = case.match(line)
        if m:
            last = [m.group(1), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                    float(m.group(6)), float(m.group(7)), None, int(m.group(2))]
            continue
        c = re.match(r"^\s+counts ([0-9,]+)$", line)
        if c and last:
            last[6] = [int(v) for v in c.group(1).split(",")]
            if len(last[6]) != last[7] or sum(last[6]) != last[1]:
                sys.exit(f"grouped_torch.py: {path}: counts of '{last[0]}' do not add up")
            out.append(tuple(last[:7]))
            last = None
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = cases(sys.argv[1])
    if not rows:
        sys.exit(f"grouped_torch.py: no forward grouped case with counts in {sys.argv[1]}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| case | counts | ours ms | ours TFLOP/s | torch._grouped_mm ms | TFLOP/s | ours / torch |")
    print("|---|---|---|---|---|---|---|")
    for name, M, I, O, ms, tf, counts in rows:
        E = len(counts)
        offs = torch.cumsum(torch.tensor(counts), 0).to(torch.int32).cuda()
        x = torch.randn(M, I, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(E, O, I, device="cuda", dtype=torch.bfloat16)
        t = median_ms(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))
        ttf = 2.0 * M * I * O / t / 1e9
        print(f"| {name} | {' '.join(map(str, counts))} | {ms:.3f} | {tf:.1f} | {t:.3f} | "
              f"{ttf:.1f} | {t / ms:.2f}x |", flush=True)
        del x, w


if __name__ == "__main__":
    main()
