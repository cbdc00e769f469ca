#!/bin/sh
# Installs what ptrain needs, on Debian/Ubuntu with apt-get (sudo when not
# root); on other systems prints what is missing and exits 1.
#   scripts/deps.sh run    compiler with OpenMP + OpenBLAS (OpenMP build)
#   scripts/deps.sh test   also gcc, g++, clang + libomp and its ThreadSanitizer
#                          runtime, Open MPI, valgrind, strace, python3, iproute2
#                          (ip, tc and bridge for tests/hosts.sh)
#   scripts/deps.sh mpi    Open MPI (mpicc, mpirun) only
#   scripts/deps.sh fuzz   clang with libFuzzer (make fuzz)
#   scripts/deps.sh text   node and npm (the reference tokenizers, tests/ref/tokenizer_ref.js)
#   scripts/deps.sh serve  libmicrohttpd (build/serve's HTTP; ptrain.h never needs it)
mode=${1:-run}
CC=${CC:-gcc}
CLANG=${CLANG:-clang}
have() { command -v "$1" >/dev/null 2>&1; }
omp_ok() {
    printf '#include <omp.h>\nint main(void){return omp_get_max_threads()<1;}\n' |
        "$1" -fopenmp -x c - -o /dev/null 2>/dev/null
}
fuzzer_ok() { # libFuzzer's runtime is a package of its own on Debian 12
    printf 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0 * (d[0] + n); }\n' |
        "$CLANG" -fsanitize=fuzzer,address,undefined -x c - -o /dev/null 2>/dev/null
}
tsan_ok() { # so is the ThreadSanitizer runtime (libclang-rt-14-dev on Debian 12)
    printf 'int main(void){return 0;}\n' |
        "$CLANG" -fsanitize=thread -x c - -o /dev/null 2>/dev/null
}
arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
need=""
if [ "$mode" != mpi ] && [ "$mode" != fuzz ] && [ "$mode" != text ] && [ "$mode" != serve ]; then
    have "$CC" || need="$need $CC"
    [ -f "/usr/include/$arch/openblas-openmp/cblas.h" ] || need="$need libopenblas-openmp-dev"
    case "$CC" in *clang*) { have "$CC" && omp_ok "$CC"; } || need="$need libomp-dev" ;; esac
fi
if [ "$mode" = test ] || [ "$mode" = mpi ]; then # Open MPI, not MPICH (ENVIRONMENT.md)
    have mpicc || need="$need libopenmpi-dev"
    have mpirun || need="$need openmpi-bin"
fi
if [ "$mode" = test ]; then
    have gcc || need="$need gcc"
    have g++ || need="$need g++"
    have "$CLANG" || need="$need clang"
    { have "$CLANG" && omp_ok "$CLANG"; } || need="$need libomp-dev"
    { have "$CLANG" && tsan_ok; } || need="$need libclang-rt-dev"
    have valgrind || need="$need valgrind"
    have strace || need="$need strace"
    have python3 || need="$need python3" # the tests check JSON output with json.tool
    { have ip && have tc && have bridge; } || need="$need iproute2"
fi
if [ "$mode" = serve ] || [ "$mode" = test ]; then
    [ -f /usr/include/microhttpd.h ] || need="$need libmicrohttpd-dev"
fi
if [ "$mode" = text ] || [ "$mode" = test ]; then
    have node || need="$need nodejs"
    have npm || need="$need npm"
fi
if [ "$mode" = fuzz ]; then
    have "$CLANG" || need="$need clang"
    { have "$CLANG" && fuzzer_ok; } || need="$need libclang-rt-dev"
fi
need=$(echo $need | tr ' ' '\n' | sort -u | tr '\n' ' ')
[ -z "${need% }" ] && exit 0
if have apt-get; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "ptrain: installing $need"
    $SUDO apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need ||
        { echo "ptrain: installing failed; run: sudo apt-get install $need"; exit 1; }
else
    echo "ptrain: missing: $need"
    echo "On Debian/Ubuntu: sudo apt-get install $need"
    echo "Elsewhere: a C11 compiler with OpenMP and OpenBLAS, then"
    echo "  make BLAS_INC=/path/to/openblas/include BLAS_LIB=/path/to/openblas/lib"
    exit 1
fi
