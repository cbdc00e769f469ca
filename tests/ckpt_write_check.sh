#!/bin/sh
# A checkpoint write is durable: under strace, the temporary file is synced
# before the rename makes it the checkpoint, and the directory after it.
# A checkpoint that cannot be written -- the file size limit reached
# (RLIMIT_FSIZE), a full disk, a read-only directory -- is an error message
# and exit status 1, and the previous checkpoint survives intact: it still
# loads (checksums verified), still holds its step, and no .tmp is left.
# The full disk and the read-only directory need root and mount namespaces
# (a small tmpfs in a namespace of this script's own, gone when it ends);
# without them, or without strace (make test installs it: scripts/deps.sh
# test), those cases print SKIP, and when nothing failed the script exits 77
# (skipped, tests/run.sh counts it apart), never 0.
#   sh tests/ckpt_write_check.sh
set -u
if [ "${1:-}" != --in-namespace ]; then
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    export PT_DISKFULL_DIR="$dir"
    if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
        unshare -m sh "$0" --in-namespace
        exit $?
    fi
    echo "SKIP: not root or no mount namespaces: the full disk and read-only cases are not checked"
    sh "$0" --in-namespace --no-mount
    rc=$?
    [ "$rc" -eq 0 ] && exit 77
    exit "$rc"
fi
dir=$PT_DISKFULL_DIR
bad=0
skipped=0
run="build/train --preset tiny --batch 4 --seq 32 --steps 10 --sample-tokens 0 --threads 2
     --peak-gflops 100"
check() { # check WHAT CKPT STEP LOG PATTERN: the run failed with PATTERN, CKPT is intact at STEP
    if [ "$rc" -eq 1 ] && grep -q -- "$5" "$4" && ! ls "$2".tmp >/dev/null 2>&1 &&
        build/sample "$2" --tokens 1 >/dev/null 2>&1 && grep -aq "\"step\":\"$3\"" "$2"; then
        echo "ok: $1: $(grep -m1 -- "$5" "$4")"
    else
        echo "FAIL: $1 (exit $rc, wanted 1 and \"$5\"; the old checkpoint at step $3 intact)"
        tail -n 3 "$4"
        bad=1
    fi
}

# open tmp (fd), fsync(fd), rename(tmp, path), open the directory (dfd), fsync(dfd)
if command -v strace >/dev/null 2>&1; then
    $run --steps 1 --checkpoint "$dir/d.safetensors" >/dev/null &&
        strace -f -e trace=openat,fsync,rename -o "$dir/strace.log" $run --steps 2 \
            --resume "$dir/d.safetensors" --checkpoint "$dir/d.safetensors" >/dev/null
    if awk -v tmp="$dir/d.safetensors.tmp" -v dir="$dir" '
        index($0, "openat(AT_FDCWD, \"" tmp "\", O_WRONLY") { fd = $NF; s = 1; next }
        s == 1 && $0 ~ "fsync\\(" fd "\\) += 0$" { s = 2; next }
        s == 2 && index($0, "rename(\"" tmp "\"") && $NF == 0 { s = 3; next }
        s == 3 && index($0, "openat(AT_FDCWD, \"" dir "\", O_RDONLY") { dfd = $NF; s = 4; next }
        s == 4 && $0 ~ "fsync\\(" dfd "\\) += 0$" { s = 5 }
        END { exit s != 5 }' "$dir/strace.log"; then
        echo "ok: durable: fsync of the temporary file, rename, fsync of the directory"
    else
        echo "FAIL: the checkpoint write is not open, fsync, rename, fsync of the directory"
        grep -e fsync -e rename -e "d.safetensors" "$dir/strace.log" | tail -n 8
        bad=1
    fi
else
    echo "SKIP: no strace: the fsync order is not checked"
    skipped=1
fi

# the file size limit (SIGXFSZ ignored, so write fails with EFBIG): 512 KB
$run --stop-after 2 --checkpoint "$dir/c.safetensors" >/dev/null
sh -c 'trap "" XFSZ; ulimit -f 1000; exec "$@"' sh $run --resume "$dir/c.safetensors" \
    --checkpoint "$dir/c.safetensors" >"$dir/fsize.log" 2>&1
rc=$?
check "file size limit" "$dir/c.safetensors" 2 "$dir/fsize.log" "File too large"

if [ "${2:-}" != --no-mount ]; then
    # a 2 MB disk: one checkpoint of 1.4 MB fits, its replacement beside it does not
    mkdir "$dir/small"
    mount -t tmpfs -o size=2m tmpfs "$dir/small" || { echo "FAIL: cannot mount a tmpfs"; exit 1; }
    $run --checkpoint-every 1 --checkpoint "$dir/small/c.safetensors" >"$dir/full.log" 2>&1
    rc=$?
    check "full disk" "$dir/small/c.safetensors" 1 "$dir/full.log" "No space left on device"
    # the same directory read-only
    rm -f "$dir/small"/*.tmp
    mount -o remount,ro "$dir/small"
    $run --resume "$dir/small/c.safetensors" --checkpoint "$dir/small/c.safetensors" \
        >"$dir/ro.log" 2>&1
    rc=$?
    check "read-only directory" "$dir/small/c.safetensors" 1 "$dir/ro.log" \
        "Read-only file system"
    umount "$dir/small"
fi
[ "$bad" -eq 0 ] && [ "$skipped" -ne 0 ] && exit 77
exit $bad
