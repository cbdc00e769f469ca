#!/bin/sh
# Pipeline bubbles measured on thread-rank stages beside the theory, and the
# activation slots each stage used beside the schedule checker's prediction
# (build/bench_pipeline; 8 blocks 128 wide, micro-batches of one 64-token
# sequence). With 4 stages the ranks outnumber this machine's cores: those
# rows time-share. Also writes the timed 1F1B step (p=2, m=8) as
# build/pipeline_1f1b.json (chrome://tracing) and build/pipeline_1f1b.svg.
set -e
cd "$(dirname "$0")/.."
cores=$(nproc)
for p in 2 4; do
    note=""
    [ "$p" -gt "$cores" ] && note=" ($p stages on $cores cores: they time-share)"
    echo "-- $p stages$note"
    for s in gpipe 1f1b interleaved zb-h1 zb-h2 zb-v chimera 2bw; do
        for m in 1 2 4 8 16; do
            # interleaved, chimera and 2bw take micro-batches in multiples of the stages
            case $s in interleaved | chimera | 2bw) [ $((m % p)) -ne 0 ] && continue ;; esac
            build/bench_pipeline --stages "$p" --schedule "$s" --microbatches "$m"
        done
    done
done
build/bench_pipeline --stages 2 --schedule 1f1b --microbatches 8 \
    --trace build/pipeline_1f1b.json --svg build/pipeline_1f1b.svg >/dev/null
echo "timeline of a measured 1F1B step: build/pipeline_1f1b.json, build/pipeline_1f1b.svg"
