#!/usr/bin/env python3
"""torch_mm: torch.mm's GFLOP/s on the GEMM shapes build/bench_kernels sends it.

    build/bench_kernels --only gemm --torch /usr/bin/python3

bench_kernels starts this script once (from the repository's root) with pipes
as stdin and stdout. Its first line names torch's version, or why torch did
not import. Then for each line "ta tb M N K reps threads" it times
C = op(A) @ op(B), M x N x K, on `threads` threads: A stored M x K (ta = 1:
K x M, used through its transposed view, as torch runs x @ W.t()), B stored
K x N (tb = 1: N x K), in float32 and then in bfloat16 (bf16 operands, so
torch.mm computes and returns bf16); for each, one warm-up call, then the
median of `reps` calls by time.perf_counter (the upper median for even reps,
as bench_kernels takes). C is preallocated (torch.mm's out=), as the other
columns write into a buffer: the time is the GEMM's, not the allocator's. It
answers one line: "fp32_gflops bf16_gflops".

Needs Debian's python3-torch (1.13): /usr/bin/python3.
"""

import sys
import time

try:
    import torch
except ImportError as e:
    print("cannot import torch: %s" % e, flush=True)
    sys.exit(1)


def operand(rows, cols, trans, dtype):
    """A rows x cols operand of uniform values in [-1, 1); stored transposed when trans."""
    if trans:
        return (torch.rand(cols, rows) * 2 - 1).to(dtype).t()
    return (torch.rand(rows, cols) * 2 - 1).to(dtype)


def gflops(ta, tb, M, N, K, reps, dtype):
    a, b = operand(M, K, ta, dtype), operand(K, N, tb, dtype)
    c = torch.empty(M, N, dtype=dtype)
    torch.mm(a, b, out=c)  # warm-up
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        t.append(time.perf_counter() - t0)
    return 2.0 * M * N * K / sorted(t)[reps // 2] / 1e9


def main():
    print("torch %s" % torch.__version__, flush=True)
    for line in sys.stdin:
        ta, tb, M, N, K, reps, threads = map(int, line.split())
        torch.set_num_threads(threads)
        fp32 = gflops(ta, tb, M, N, K, reps, torch.float32)
        bf16 = gflops(ta, tb, M, N, K, reps, torch.bfloat16)
        print("%.3f %.3f" % (fp32, bf16), flush=True)


if __name__ == "__main__":
    main()
