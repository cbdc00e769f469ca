#!/bin/sh
# make fuzz: each harness named on the command line under libFuzzer for
# FUZZ_TIME seconds (default 60), from the generated seed corpus plus its
# committed crash inputs. The corpus grows in build/fuzz/corpus/<name>/
# across runs; a finding is written to build/fuzz/findings/<name>/ and
# makes the exit status 1 (minimise it, commit it to fuzz/crashes/<name>/,
# fix the bug: `make test` replays it from then on).
time=${FUZZ_TIME:-60}
out=build/fuzz
build/fuzz/seeds "$out/corpus" || exit 1
status=0
harnesses=$*
for h in $harnesses; do
    mkdir -p "$out/corpus/$h" "$out/findings/$h"
    set -- -max_total_time="$time" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 \
        -print_final_stats=1 -artifact_prefix="$out/findings/$h/"
    [ -f "fuzz/$h.dict" ] && set -- "$@" -dict="fuzz/$h.dict"
    set -- "$@" "$out/corpus/$h" # new inputs go to the first directory
    [ -d "fuzz/crashes/$h" ] && set -- "$@" "fuzz/crashes/$h"
    "$out/${h}_libfuzzer" "$@" >"$out/$h.log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$h.log")
    if [ "$rc" -eq 0 ]; then
        echo "fuzz $h: ${runs:-?} executions in ${time} s, no finding"
    else
        echo "fuzz $h: FINDING (exit $rc): $out/findings/$h/, log $out/$h.log"
        grep -m 3 -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$out/$h.log" | sed 's/^/      /'
        status=1
    fi
done
exit $status
