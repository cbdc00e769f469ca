#!/bin/sh
# Every GEMM shape of gpt2-124m in OpenBLAS, ptrain, oneDNN and torch.mm, fp32 and bf16,
# measured side by side in one run against the machine's instruction peaks. Run it with
#   make bench-gemm
# (or `sh bench/gemm.sh`). Installs Debian's libdnnl-dev and python3-torch first if they
# are missing, builds build/bench_kernels_dnnl and runs its GEMM table on 2 threads.
set -e
cd "$(dirname "$0")/.."
need=
[ -f /usr/include/oneapi/dnnl/dnnl.h ] || need="$need libdnnl-dev"
/usr/bin/python3 -c 'import torch' 2>/dev/null || need="$need python3-torch"
if [ -n "$need" ]; then
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "ptrain: installing$need"
    # shellcheck disable=SC2086 # $need is split into package names on purpose
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           $SUDO apt-get install -y -qq --no-install-recommends $need; }; then
        echo "ptrain: installing failed; run: sudo apt-get install$need"
        exit 1
    fi
fi
${MAKE:-make} --no-print-directory build/bench_kernels_dnnl
build/bench_kernels_dnnl --only gemm --threads 2 --reps 7 --torch /usr/bin/python3
