#!/bin/sh
# Two trees' GEMM drivers (say main's and a branch's ptrain.h) in ONE binary, on a model's
# layer GEMMs at B8 T256 (2048 rows), alternated call by call, so both see the same machine
# load; prints each side's median GFLOP/s by the wall clock and by CPU time and the ratios
# new/old (< 1: new is faster), and whether both give the same bits. On a shared machine
# the CPU-time ratio (waiting threads asleep: OMP_WAIT_POLICY=passive) is the steadier one.
#   sh bench/ab_gemm.sh OLD_DIR NEW_DIR [REPS [gpt2-124m|llama-124m|gpt2-head [FILTER]]]
# e.g. git worktree add --detach /tmp/old main && sh bench/ab_gemm.sh /tmp/old . 11
set -e
old=$1 new=$2
shift 2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
F="-std=c11 -Wall -Wextra -Wpedantic -O2 -march=native -mprefer-vector-width=512 -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-openmp"
${CC:-gcc} $F -DAB_SIDE=old -I"$old" -c "$here/ab_gemm_side.c" -o "$out/old.o"
${CC:-gcc} $F -DAB_SIDE=new -I"$new" -c "$here/ab_gemm_side.c" -o "$out/new.o"
${CC:-gcc} $F "$here/ab_gemm.c" "$out/old.o" "$out/new.o" -o "$out/ab_gemm" \
    -L/usr/lib/x86_64-linux-gnu/openblas-openmp \
    -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lm
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} "$out/ab_gemm" "$@"
