#!/bin/sh
# build/train killed with SIGKILL again and again, mostly in the middle of a
# checkpoint write, and restarted each time with the same command
# (--resume latest): every restart finds a checkpoint that loads whole, and
# the run that was killed N times ends with the same losses, to the last
# printed digit, and the same final checkpoint, byte for byte, as a run
# that never was.
#   sh tests/crash_check.sh [TRIALS]   (default 30)
# PTRAIN_TEST_WRITE_DELAY_MS makes each of a checkpoint's 85 tensors take a
# few ms to write, so most of a run's time is spent inside writes. A killed
# process's files stay in the page cache, so tmpfs (/dev/shm) serves as well
# as a disk here and costs no fsync time.
set -u
trials=${1:-30}
root=/dev/shm
[ -d $root ] && [ -w $root ] || root=/tmp
dir=$(mktemp -d "$root/ptrain_crash.XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/ref" "$dir/run"
steps=40
common="--preset tiny --batch 4 --seq 32 --steps $steps --warmup 5 --eval-every 1000 --log-every 1
        --sample-tokens 0 --threads 2 --seed 5 --peak-gflops 100 --checkpoint-every 1 --keep 2
        --resume latest"
final=$(printf 'c-step%08d.safetensors' $steps)
losses() { grep -h '^step' "$@" | awk -F'|' '{print $1 $2}' | sort -u; }

build/train $common --checkpoint "$dir/ref/c.safetensors" >"$dir/ref.log" 2>&1 ||
    { echo "the reference run failed"; cat "$dir/ref.log"; exit 1; }

t=0
midwrite=0
while [ $t -lt "$trials" ]; do
    t=$((t + 1))
    PTRAIN_TEST_WRITE_DELAY_MS=3 build/train_faults $common --checkpoint "$dir/run/c.safetensors" \
        >"$dir/trial$t.log" 2>&1 &
    pid=$!
    # the kill: a random time after the first step's line, so that a slow
    # start (a busy machine) does not move it out of the writes
    n=0
    until grep -q '^step' "$dir/trial$t.log" 2>/dev/null || ! kill -0 $pid 2>/dev/null ||
        [ $n -gt 3000 ]; do
        n=$((n + 1))
        sleep 0.01
    done
    sleep "$(awk -v t=$t 'BEGIN { srand(t); printf "%.3f", 0.6 * rand() }')"
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
    ls "$dir/run"/*.tmp >/dev/null 2>&1 && midwrite=$((midwrite + 1))
done
build/train $common --checkpoint "$dir/run/c.safetensors" >"$dir/last.log" 2>&1 ||
    { echo "the run after the kills failed"; tail -n 5 "$dir/last.log"; exit 1; }

bad=0
resumes=$(grep -h '^resumed from' "$dir"/trial*.log "$dir/last.log" | sort -u | wc -l)
echo "$trials kills, $midwrite of them in the middle of a checkpoint write (a .tmp left behind);"
echo "$resumes distinct checkpoints resumed from"
if grep -l -e '^error' -e '^warning' "$dir"/trial*.log "$dir/last.log"; then
    echo "FAIL: a restart did not find a whole checkpoint"
    grep -h -e '^error' -e '^warning' "$dir"/trial*.log "$dir/last.log" | head -n 5
    bad=1
fi
losses "$dir/ref.log" >"$dir/a"
losses "$dir"/trial*.log "$dir/last.log" >"$dir/b"
if [ "$(wc -l <"$dir/a")" -ne $steps ] || ! diff "$dir/a" "$dir/b"; then
    echo "FAIL: the killed and restarted run printed other losses than the reference"
    bad=1
fi
if ! cmp "$dir/ref/$final" "$dir/run/$final"; then
    echo "FAIL: the final checkpoints differ"
    bad=1
fi
if [ "$midwrite" -lt $((trials / 2)) ] || [ "$resumes" -lt $((trials / 3)) ]; then
    echo "FAIL: too few kills landed in writes or moved the run on"
    bad=1
fi
if [ "$(ls "$dir/run" | grep -v '^c\.loss\.' | tr '\n' ' ')" != \
    "c-step$(printf %08d $((steps - 1))).safetensors $final " ]; then
    echo "FAIL: --keep 2 kept other files than the last two checkpoints:" $(ls "$dir/run")
    bad=1
fi
# a damaged newest checkpoint: --resume latest warns, takes the one before, and
# step 40 is redone into the same bytes
printf 'XXXX' | dd of="$dir/run/$final" bs=1 conv=notrunc \
    seek=$(($(wc -c <"$dir/run/$final") - 1000)) 2>/dev/null
build/train $common --checkpoint "$dir/run/c.safetensors" >"$dir/again.log" 2>&1
if ! grep -q "^warning: --resume latest skips .*$final: .*fails its checksum" "$dir/again.log" ||
    ! grep -q "^resumed from .*step$(printf %08d $((steps - 1))).safetensors" "$dir/again.log" ||
    ! cmp "$dir/ref/$final" "$dir/run/$final"; then
    echo "FAIL: --resume latest did not step back over a damaged checkpoint"
    head -n 3 "$dir/again.log"
    bad=1
fi
# all of them damaged: an error, not a fresh start that would replace them
for f in "$dir"/run/*.safetensors; do
    printf 'XXXX' | dd of="$f" bs=1 conv=notrunc seek=$(($(wc -c <"$f") - 1000)) 2>/dev/null
done
build/train $common --checkpoint "$dir/run/c.safetensors" >"$dir/none.log" 2>&1
if [ $? -ne 1 ] || ! grep -q "^error: --resume latest: no checkpoint of .* loads" "$dir/none.log"
then
    echo "FAIL: --resume latest with only damaged checkpoints did not refuse to start"
    tail -n 3 "$dir/none.log"
    bad=1
fi
[ $bad -eq 0 ] && echo "every loss of steps 1-$steps and the final checkpoint equal the uninterrupted run's"
exit $bad
