#!/bin/sh
# Runs a training program under mpirun over a host file and, when a run ends because a
# host was lost, goes on without it: drops the host, and starts again with --resume latest
# (the checkpoint is layout-free) in the largest layout the remaining hosts allow.
#
#   scripts/elastic.sh --hostfile FILE [--max-restarts N] [--mpirun CMD] -- PROG ARGS...
#
# FILE: one host a line, "HOST slots=K" (Open MPI's format; slots default to 1).
# PROG ARGS: e.g. build/train_mpi ... --checkpoint RUN.safetensors --keep K
# --checkpoint-every S; elastic.sh adds --resume latest and --dp D, where D is the
# largest number of data-parallel ranks that the hosts' slots hold (with ARGS' --tp and
# --pp) and that divides ARGS' --batch. A run that ends with status 0 ends elastic.sh.
# A run that fails: the hosts its ranks named as lost (the comm timeout's "no answer
# from rank R on host H", or Open MPI's "lost communication with a remote daemon" /
# "HNP daemon ... on node H") and the hosts that do not answer a ping are dropped; if
# none is, elastic.sh ends with the run's status (not a lost host: a bug, bad data, ...).
# Each restart is logged on stderr: "elastic: restart N of M: lost HOST; resuming from
# FILE (step S, K steps lost) on H hosts as tp x dp x pp". At most --max-restarts
# (default 3) restarts. --mpirun: the launcher (default mpirun; tests/hosts.sh --run sets
# PT_MPIRUN to one that reaches its namespace hosts). Exit status: the last run's.
set -u
hostfile= max=3 mpirun=${PT_MPIRUN:-mpirun}
usage() {
    echo "usage: $0 --hostfile FILE [--max-restarts N] [--mpirun CMD] -- PROG ARGS..." >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case $1 in
    --hostfile) hostfile=${2:-}; shift 2 || usage ;;
    --max-restarts) max=${2:-}; shift 2 || usage ;;
    --mpirun) mpirun=${2:-}; shift 2 || usage ;;
    --) shift; break ;;
    *) usage ;;
    esac
done
[ $# -ge 1 ] && [ -n "$hostfile" ] && [ -r "$hostfile" ] || usage
case $max in '' | *[!0-9]*) usage ;; esac
# ARGS' --tp, --pp, --batch, --checkpoint (and --dp dropped: elastic.sh sets it)
tp=1 pp=1 batch= ckpt= prog=$1
shift
n=$#
i=0
while [ "$i" -lt "$n" ]; do
    a=$1
    shift
    i=$((i + 1))
    case $a in
    --tp | --pp | --batch | --checkpoint | --dp | --resume)
        v=${1:-}
        shift
        i=$((i + 1))
        case $a in
        --tp) tp=$v ;;
        --pp) pp=$v ;;
        --batch) batch=$v ;;
        --checkpoint) ckpt=$v ;;
        esac
        [ "$a" = --dp ] || [ "$a" = --resume ] || set -- "$@" "$a" "$v"
        ;;
    *) set -- "$@" "$a" ;;
    esac
done
[ -n "$ckpt" ] || { echo "elastic.sh: the program needs --checkpoint (and --keep) to resume" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
grep -v '^[[:space:]]*\(#\|$\)' "$hostfile" >"$dir/hosts"

# the newest step file of --checkpoint (STEM-stepNNNNNNNN.safetensors) and its step
latest() {
    ls "${ckpt%.safetensors}"-step*.safetensors 2>/dev/null | sort | tail -n 1
}
step_of() { echo "$1" | sed -n 's/.*-step0*\([0-9][0-9]*\)\.safetensors$/\1/p'; }

restarts=0
while :; do
    slots=$(awk '{ k = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) k = substr($i, 7) + 0
                   s += k } END { print s + 0 }' "$dir/hosts")
    dp=$((slots / (tp * pp)))
    if [ -n "$batch" ]; then
        while [ "$dp" -gt 1 ] && [ $((batch % dp)) -ne 0 ]; do dp=$((dp - 1)); done
    fi
    [ "$dp" -ge 1 ] || { echo "elastic.sh: $slots slots left, fewer than tp $tp x pp $pp" >&2; exit 1; }
    hosts=$(wc -l <"$dir/hosts")
    echo "elastic: $hosts hosts, tp $tp x dp $dp x pp $pp = $((tp * dp * pp)) ranks" >&2
    { $mpirun --hostfile "$dir/hosts" -n $((tp * dp * pp)) "$prog" "$@" --dp "$dp" \
        --checkpoint "$ckpt" --resume latest 2>&1; echo $? >"$dir/rc"; } | tee "$dir/log"
    rc=$(cat "$dir/rc")
    [ "$rc" -ne 0 ] || exit 0
    # the lost hosts: named by the ranks' probes or by Open MPI, or silent to a ping
    sed -n 's/.*no answer from //p; s/.*lost communication with a remote daemon.*on node \([^ ]*\).*/on host \1/p' \
        "$dir/log" | tr ',' '\n' | sed -n 's/.*on host \([^ ]*\).*/\1/p' | sort -u >"$dir/named"
    : >"$dir/lost"
    while read -r h rest; do
        if grep -qx -e "$h" "$dir/named" ||
            { command -v ping >/dev/null 2>&1 && ! ping -c 1 -W 2 "$h" >/dev/null 2>&1; }; then
            echo "$h" >>"$dir/lost"
        fi
    done <"$dir/hosts"
    if [ ! -s "$dir/lost" ]; then
        echo "elastic: the run failed (status $rc) with every host there: not restarting" >&2
        exit "$rc"
    fi
    if [ "$restarts" -ge "$max" ]; then
        echo "elastic: lost $(paste -sd ' ' "$dir/lost"), after $restarts restarts (--max-restarts $max): giving up" >&2
        exit "$rc"
    fi
    restarts=$((restarts + 1))
    awk -v lost="$(paste -sd '|' "$dir/lost")" \
        'BEGIN { n = split(lost, l, "|"); for (i = 1; i <= n; i++) bad[l[i]] = 1 } !($1 in bad)' \
        "$dir/hosts" >"$dir/left"
    mv "$dir/left" "$dir/hosts"
    [ -s "$dir/hosts" ] || { echo "elastic: no host left" >&2; exit "$rc"; }
    ck=$(latest)
    reached=$(sed -n 's/^step *\([0-9][0-9]*\)\/.*/\1/p' "$dir/log" | tail -n 1)
    at=$(step_of "$ck")
    echo "elastic: restart $restarts of $max: lost $(paste -sd ' ' "$dir/lost"); resuming from" \
        "${ck:-nothing (a fresh start)} (step ${at:-0}, $(( ${reached:-0} - ${at:-0} )) steps lost)" \
        "on $(wc -l <"$dir/hosts") hosts" >&2
done
