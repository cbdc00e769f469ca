#!/bin/sh
# The whole test suite (called by `make test` after building everything).
# Each step is one check; the last line is "N passed, N failed".
CC=${CC:-gcc}
CXX=${CXX:-g++}
arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BLAS=${BLAS:-"-I/usr/include/$arch/openblas-openmp -L/usr/lib/$arch/openblas-openmp -Wl,-rpath,/usr/lib/$arch/openblas-openmp -lopenblas"}
WERR="-O2 -Wall -Wextra -Wpedantic -Werror"  # -O2: optimizer passes warn too
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=print_stacktrace=1

step() { # step NAME CMD...: passes if CMD exits 0
    name=$1
    shift
    if "$@" >"$tmp/out" 2>&1; then
        pass=$((pass + 1))
        printf 'ok    %s\n' "$name"
    else
        fail=$((fail + 1))
        printf 'FAIL  %s\n' "$name"
        tail -n 40 "$tmp/out" | sed 's/^/      /'
    fi
}
fails() { # fails NAME CODE PATTERN CMD...: passes if CMD exits with CODE and prints PATTERN
    name=$1 code=$2 pattern=$3
    shift 3
    "$@" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -eq "$code" ] && grep -q -- "$pattern" "$tmp/out"; then
        pass=$((pass + 1))
        printf 'ok    %s\n' "$name"
    else
        fail=$((fail + 1))
        printf 'FAIL  %s (exit %s, wanted %s and "%s")\n' "$name" "$rc" "$code" "$pattern"
        tail -n 20 "$tmp/out" | sed 's/^/      /'
    fi
}
show() { grep -E "passed, [0-9]+ failed" "$tmp/out" | tail -n 1 | sed 's/^/      /'; }

# unit tests: optimised, under AddressSanitizer + UBSan, and on the plain-C matmul
step "unit tests" build/tests; show
step "unit tests (ASan + UBSan)" build/tests_asan; show
step "unit tests (PTRAIN_NO_BLAS)" build/tests_noblas; show

# the fixtures: the project's own, and the shared ones when ../shared is there
for f in tests/fixtures/*.safetensors; do
    step "fixture $(basename "$f")" build/fixture_check "$f"
done
if [ -d ../shared/fixtures ]; then
    for f in ../shared/fixtures/*.safetensors; do
        step "shared fixture $(basename "$f")" build/fixture_check "$f"
    done
else
    echo "note  ../shared/fixtures not found: shared fixtures not run"
fi
step "fixture gpt2_odd under ASan + UBSan" build/fixture_check_asan tests/fixtures/gpt2_odd.safetensors
fails "fixture_check rejects a non-fixture" 2 "error:" build/fixture_check tests/run.sh
fails "fixture_check rejects a missing file" 2 "cannot open" build/fixture_check "$tmp/none.safetensors"

# the header: warning-free in two translation units with gcc and clang, and as C++
for cc in gcc clang; do
    step "header: two translation units, $cc -std=c11 -Werror" sh -c \
        "$cc -std=c11 $WERR -fopenmp -c tests/two_tu_a.c -o $tmp/a.o &&
         $cc -std=c11 $WERR -fopenmp -c tests/two_tu_b.c -o $tmp/b.o &&
         $cc -fopenmp $tmp/a.o $tmp/b.o -o $tmp/two_tu $BLAS -lm && $tmp/two_tu"
done
step "header: C++ (g++ -std=c++11 -Werror)" sh -c \
    "$CXX -std=c++11 $WERR -fopenmp tests/cxx_check.cpp -o $tmp/cxx $BLAS -lm && $tmp/cxx"
step "header: PTRAIN_STATIC and PTRAIN_NO_BLAS without OpenMP" sh -c \
    "$CC -std=c11 $WERR -DPTRAIN_STATIC -DPTRAIN_NO_BLAS -c tests/two_tu_b.c -o $tmp/s.o"
step "header: every exported symbol starts with pt_" sh -c \
    "$CC -std=c11 -fopenmp -c tests/two_tu_b.c -o $tmp/sym.o &&
     ! nm -g --defined-only $tmp/sym.o | awk '{print \$3}' | grep -v -e '^pt_' -e '^main\$'"

# examples
step "example: hello_layer (finite-difference check)" build/hello_layer
step "example: quickstart" build/quickstart
step "quick start in ptrain.h equals examples/quickstart.c" sh tests/snippet_check.sh
awk '/^```c$/{f=1;next}/^```$/{f=0}f' README.md >"$tmp/readme_prog.c"
step "README: the program using the header builds and trains" sh -c \
    "$CC -std=c11 $WERR -fopenmp -I. $tmp/readme_prog.c -o $tmp/readme_prog $BLAS -lm &&
     $tmp/readme_prog | tail -n 1 | awk '{exit !(\$4 < 1.0)}'"
ck="$tmp/ckpt.safetensors"
step "train: tiny run with checkpoint" build/train --preset tiny --steps 40 --batch 4 --seq 32 \
    --eval-every 20 --log-every 20 --sample-tokens 40 --checkpoint "$ck" --threads 2
step "train: resume from the checkpoint" build/train --preset tiny --steps 50 --batch 4 --seq 32 \
    --eval-every 20 --log-every 10 --sample-tokens 0 --resume "$ck" --threads 2
step "train: interrupted + resumed run prints the same losses" sh tests/resume_check.sh
step "sample: generate from the checkpoint" build/sample "$ck" --tokens 30
fails "train: --seq beyond the context is refused" 1 "seq=128 must be in \[1, block_size=64\]" \
    build/train --preset tiny --block-size 64 --seq 128 --steps 1 --batch 1 --sample-tokens 0
fails "train: missing data file" 1 "cannot open" build/train --data "$tmp/nope.txt"
fails "train: malformed number" 2 "expects an integer" build/train --steps 12x
fails "train: unknown preset" 1 "unknown model preset" build/train --preset gpt5
fails "train: n_embd not divisible by n_head" 1 "not divisible" build/train --embd 100 --heads 3
printf 'not a checkpoint' >"$tmp/bad.safetensors"
fails "sample: malformed model file" 1 "safetensors" build/sample "$tmp/bad.safetensors"

echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
