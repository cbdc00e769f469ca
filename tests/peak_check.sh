#!/bin/sh
# The instruction peak MFU is measured against is measured once per machine
# and kept (common/peak.h), in a cache of this test's own
# (PTRAIN_CACHE_DIR): a first run measures and keeps it; a kept idle
# measurement is used as it is (a planted value shows in the header); one
# kept from a loaded machine is measured again and the larger kept;
# --measure-peak measures anew and replaces it; a peak below what the run
# reaches never shows an MFU above 100%. No check depends on the machine's
# load or speed.
set -u
. tests/check.sh
export PTRAIN_CACHE_DIR="$dir/cache"
run="build/train --preset tiny --steps 2 --batch 4 --seq 16 --sample-tokens 0 --threads 1"
peakline() { grep '^threads 1; GEMM' "$1"; }

$run >"$dir/a.log" 2>&1
file=$(ls "$dir"/cache/peak-*-1t-fp32 2>/dev/null)
check "a first run measures the peak and keeps it (${file:-no file})" sh -c \
    "[ -n '$file' ] && grep -q 'fp32 peak [0-9.]* GFLOP/s (FMA instructions, measured on this machine.s cores: now, kept for later runs)' '$dir/a.log' &&
     grep -q '^gflops [0-9.]* loaded [01] share [0-9.]* load1 [-0-9.]* cores [0-9]* measured [0-9T:Z-]*$' '$file'"
[ -n "$file" ] || { cat "$dir/a.log"; exit 1; }

# (below any real measurement: a run that measured again would show more)
printf 'gflops 7.000 loaded 0 share 1.000 load1 0.10 cores 2 measured 2020-01-02T03:04Z\n' >"$file"
$run >"$dir/b.log" 2>&1
check "a kept idle measurement is used as it is: $(peakline "$dir/b.log" | cut -c1-100)" \
    grep -q 'fp32 peak 7.0 GFLOP/s (FMA instructions, measured on this machine.s cores: 2020-01-02T03:04Z, kept)' "$dir/b.log"
check "... with no note of load" sh -c "! grep -q '^note: the peak was measured under load' '$dir/b.log'"

printf 'gflops 0.500 loaded 1 share 0.300 load1 7.00 cores 2 measured 2020-01-02T03:04Z\n' >"$file"
$run >"$dir/c.log" 2>&1
check "one kept from a loaded machine is measured again, the larger kept" sh -c \
    "grep -q 'fp32 peak [0-9.]* GFLOP/s (FMA instructions, measured on this machine.s cores: now, kept for later runs)' '$dir/c.log' &&
     ! grep -q '^gflops 0.500 ' '$file'"

printf 'gflops 12345.000 loaded 0 share 1.000 load1 0.10 cores 2 measured 2020-01-02T03:04Z\n' >"$file"
$run --measure-peak >"$dir/d.log" 2>&1
check "--measure-peak measures anew and replaces the kept one" sh -c \
    "grep -q 'measured on this machine.s cores: now, kept for later runs' '$dir/d.log' && ! grep -q '^gflops 12345' '$file'"

printf 'gflops 0.001 loaded 0 share 1.000 load1 0.10 cores 2 measured 2020-01-02T03:04Z\n' >"$file"
$run --log-every 1 >"$dir/e.log" 2>&1
check "a peak below what the run reaches: a warning naming --measure-peak, MFU shown as '-'" sh -c \
    "grep -q '^warning: MFU above 100%: this run reaches [0-9.]* GFLOP/s, above the peak of 0.001 GFLOP/s: MFU shows as .-.; .*--measure-peak' '$dir/e.log' &&
     grep -q '^step     1/2 | .* | MFU     - | ' '$dir/e.log'"
check "... and never an MFU above 100%" sh -c \
    "! grep -Eq 'MFU *([1-9][0-9]{2,}|[0-9]{4,})\.[0-9]%' '$dir/e.log'"
[ "$bad" -eq 0 ] || for f in a b c d e; do echo "--- $f.log"; grep -E '^(threads|note|warning|step)' "$dir/$f.log"; done
exit "$bad"
