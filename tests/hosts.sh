#!/bin/sh
# Several "hosts" on one machine: runs an MPI program across N Linux network
# namespaces joined by veth pairs through a bridge, on Open MPI's TCP
# transport only (no shared memory between hosts), each link shaped by tc tbf.
#
#   tests/hosts.sh [--hosts N] [--slots K] [--rate RATE] [--timeout S] [--kill-host I:GLOB]
#                  [--link-down I:GLOB] [--slow-host I[:GLOB]] [--run] -- PROG ARGS...
#
# N hosts (default 2) with K ranks each (default 1): ranks 0..K-1 on host 0, K..2K-1 on
# host 1, ... (so a tp group of K consecutive ranks stays inside a host). RATE is tc's
# (default 1gbit), applied both ways on every host's link. mpirun runs inside host 0;
# the other hosts' daemons start through a launch agent that enters their namespace
# (ip netns exec), no ssh. Everything lives in namespaces named pt-PID-*: the bridge in
# a "switch" namespace of its own, addresses 10.213.0.1.. on the hosts' eth0 only, so
# nothing is configured outside them. Everything is torn down on exit, also after a
# failure, a timeout or ^C; namespaces left by a run that was killed are removed first.
# --kill-host I:GLOB: once a file matching GLOB exists, every process of host I (its
# ranks and its Open MPI daemon) is killed (a host that dies), and a line on stderr
# says when: "hosts.sh: host I killed; mpirun ended S s later".
# --link-down I:GLOB: once a file matching GLOB exists, host I's link goes down (its
# processes live on, cut off); after mpirun ends, hosts.sh waits up to 30 s for every
# process of every host to end and says "hosts.sh: host I's link down; mpirun ended S s
# later; every process gone G s later" (or lists the ones left, which it then kills).
# --slow-host I[:GLOB]: host I's ranks get a twentieth of a core (a cpu cgroup capped at 5 ms of
# every 100 ms; without one, stopped 190 ms of every 200 ms with SIGSTOP/SIGCONT): a straggler;
# with GLOB, from the moment a file matching it exists (a start-up slowed twentyfold is not
# what the check is about). A line on stderr says which cap was used.
# --run: PROG runs inside host 0 instead of under mpirun, with PT_HOSTFILE (the hosts'
# addresses and slots) and PT_MPIRUN (an mpirun that reaches them) in its environment:
# for launchers of their own (scripts/elastic.sh).
# Each host gives up on a TCP connection after 5 retransmissions (about 13 s; Linux's
# default of 15 waits 15 minutes), as a cluster tuned for it does: so Open MPI's daemons and
# mpirun notice a host whose link went down, and end.
# On a timeout, each host's processes (state, wait channel, kernel stack) and TCP sockets as
# they were 2 s before it go to stderr (taken before the kill, so a hang shows where it hangs).
# Exit status: the program's (mpirun's); 124 on timeout (137 when mpirun, stuck on a host it
# cannot reach, ignores the TERM and is killed 10 s later); 77 with a line starting
# "SKIP" where the kernel (or the lack of privileges) refuses network namespaces.
set -u
hosts=2 slots=1 rate=1gbit limit=60 kill= down= slow= run=
usage() {
    echo "usage: $0 [--hosts N] [--slots K] [--rate RATE] [--timeout S] [--kill-host I:GLOB]" \
        "-- PROG ARGS..." >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case $1 in
    --hosts) hosts=${2:-}; shift 2 || usage ;;
    --slots) slots=${2:-}; shift 2 || usage ;;
    --rate) rate=${2:-}; shift 2 || usage ;;
    --timeout) limit=${2:-}; shift 2 || usage ;;
    --kill-host) kill=${2:-}; shift 2 || usage ;;
    --link-down) down=${2:-}; shift 2 || usage ;;
    --slow-host) slow=${2:-}; shift 2 || usage ;;
    --run) run=1; shift ;;
    --) shift; break ;;
    *) usage ;;
    esac
done
[ $# -ge 1 ] || usage
case $hosts$slots in *[!0-9]*|'') usage ;; esac
[ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] && [ "$slots" -ge 1 ] || usage
case $limit in *[!0-9]*|'') usage ;; esac
victim=${kill%%:*} glob=${kill#*:}
case $victim in *[!0-9]*) usage ;; esac
[ -z "$kill" ] || { [ -n "$victim" ] && [ "$victim" -lt "$hosts" ] && [ -n "$glob" ]; } || usage
cut=${down%%:*} dglob=${down#*:}
sglob=
case $slow in *:*) sglob=${slow#*:} slow=${slow%%:*} ;; esac
case $cut$slow in *[!0-9]*) usage ;; esac
[ -z "$down" ] || { [ -n "$cut" ] && [ "$cut" -lt "$hosts" ] && [ -n "$dglob" ]; } || usage
[ -z "$slow" ] || [ "$slow" -lt "$hosts" ] || usage
# the rate in bit/s, for tbf's bucket: 4 ms at the rate (one timer tick at HZ=250), at
# least 64 KB (more than one 64 KB TCP segment burst)
bps=$(echo "$rate" | awk '/^[0-9.]+(bit|kbit|mbit|gbit)$/ {
        n = $0 + 0; u = $0; sub(/^[0-9.]+/, "", u)
        m = u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : 1; printf "%.0f", n * m }')
[ -n "$bps" ] || { echo "$0: --rate $rate: expected e.g. 400mbit or 1gbit" >&2; exit 2; }
burst=$(awk -v b="$bps" 'BEGIN { x = b / 8 / 250; if (x < 65536) x = 65536; printf "%.0f", x }')

pre=pt-$$
dir=$(mktemp -d)
kill_ns() { # kill_ns NS: its processes, then the namespace (and the veths in it)
    for p in $(ip netns pids "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$1" 2>/dev/null
}
teardown() {
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$pre-"); do kill_ns "$ns"; done
    for c in /sys/fs/cgroup/$pre-slow /sys/fs/cgroup/cpu/$pre-slow; do
        [ ! -d "$c" ] || rmdir "$c" 2>/dev/null || { sleep 0.5; rmdir "$c" 2>/dev/null; }
    done
    rm -rf "$dir"
}
trap teardown EXIT
trap 'exit 130' INT TERM HUP
# namespaces of runs that died without their trap (their pid is gone)
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^pt-[0-9][0-9]*-'); do
    p=${ns#pt-}
    p=${p%%-*}
    kill -0 "$p" 2>/dev/null || kill_ns "$ns"
done

sw=$pre-sw
if ! ip netns add "$sw" 2>"$dir/err"; then
    echo "SKIP: this machine refuses network namespaces ($(head -n 1 "$dir/err"))"
    exit 77
fi
die() { echo "hosts.sh: $*" >&2; exit 1; }
ip -n "$sw" link set lo up && ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up ||
    die "cannot make the bridge"
: >"$dir/hostfile"
i=0
while [ "$i" -lt "$hosts" ]; do
    ns=$pre-h$i addr=10.213.$((i / 250)).$((i % 250 + 1))
    ip netns add "$ns" || die "cannot add namespace $ns"
    # the veth pair is made inside the switch, its other end put straight into the host
    ip -n "$sw" link add "s$i" type veth peer name eth0 netns "$ns" &&
        ip -n "$sw" link set "s$i" master br0 && ip -n "$sw" link set "s$i" up &&
        ip -n "$ns" link set lo up && ip -n "$ns" addr add "$addr/16" dev eth0 &&
        ip -n "$ns" link set eth0 up &&
        # (through /proc: sysctl is procps's, which a bare Debian lacks)
        ip netns exec "$ns" sh -c 'echo 5 >/proc/sys/net/ipv4/tcp_retries2' &&
        tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms &&
        tc -n "$sw" qdisc add dev "s$i" root tbf rate "$rate" burst "$burst" latency 100ms ||
        die "cannot set up host $i"
    echo "$addr slots=$slots" >>"$dir/hostfile"
    i=$((i + 1))
done
# the launch agent: Open MPI calls it as `agent HOST COMMAND...`
cat >"$dir/agent" <<EOF
#!/bin/sh
host=\$1
shift
i=\$(echo "\$host" | awk -F. '{print (\$3 * 250) + \$4 - 1}')
exec ip netns exec $pre-h\$i /bin/sh -c "\$*"
EOF
chmod +x "$dir/agent"
# wait until every link has its carrier (the veths come up asynchronously) and the
# bridge forwards on every port (no STP: at once)
i=0
while ip -n "$sw" -br link show master br0 | grep -qv 'UP' ||
    bridge -n "$sw" link show | grep -qv 'state forwarding'; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || die "the links do not come up"
    sleep 0.05
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
if [ -n "$down" ]; then
    ( # shellcheck disable=SC2086
        until ls $dglob >/dev/null 2>&1; do sleep 0.1; done
        ip -n "$pre-h$cut" link set eth0 down
        date +%s.%N >"$dir/down"
    ) &
    cutter=$!
fi
if [ -n "$slow" ]; then
    # the straggler's CPU cap: a cgroup of its own (v2's cpu.max, else v1's CFS quota), so
    # its ranks run 5 ms of every 100 ms and never see a signal; SIGSTOP/SIGCONT only
    # where no cpu cgroup can be made
    cg=
    if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null &&
        { grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control ||
            echo +cpu >/sys/fs/cgroup/cgroup.subtree_control; } 2>/dev/null &&
        mkdir "/sys/fs/cgroup/$pre-slow" 2>/dev/null; then
        cg=/sys/fs/cgroup/$pre-slow
        echo "5000 100000" >"$cg/cpu.max" 2>/dev/null || { rmdir "$cg"; cg=; }
    elif [ -d /sys/fs/cgroup/cpu ] && mkdir "/sys/fs/cgroup/cpu/$pre-slow" 2>/dev/null; then
        cg=/sys/fs/cgroup/cpu/$pre-slow
        { echo 100000 >"$cg/cpu.cfs_period_us" && echo 5000 >"$cg/cpu.cfs_quota_us"; } 2>/dev/null ||
            { rmdir "$cg"; cg=; }
    fi
    echo "${cg:-signals}" >"$dir/slowcap"
    ( # shellcheck disable=SC2086
      [ -z "$sglob" ] || until ls $sglob >/dev/null 2>&1; do sleep 0.1; done
      # the host's ranks, not its Open MPI daemon (nor "ip", "sh", "env" on the way to
      # it: a daemon seen stopped hangs the job, "ORTE does not know how to route a
      # message"); the list read again every 10 rounds of 200 ms
        i=0 ps=
        while :; do
            if [ $((i % 10)) -eq 0 ]; then
                ps=
                for p in $(ip netns pids "$pre-h$slow" 2>/dev/null); do
                    case $(cat "/proc/$p/comm" 2>/dev/null) in orted | mpirun | sh | timeout | ip | env | '') ;; *) ps="$ps $p" ;; esac
                done
                [ -z "$cg" ] || for p in $ps; do echo "$p" >"$cg/cgroup.procs" 2>/dev/null; done
            fi
            i=$((i + 1))
            if [ -n "$cg" ]; then
                sleep 0.2
                continue
            fi
            # shellcheck disable=SC2086
            [ -z "$ps" ] || kill -STOP $ps 2>/dev/null
            sleep 0.19
            # shellcheck disable=SC2086
            [ -z "$ps" ] || kill -CONT $ps 2>/dev/null
            sleep 0.01
        done
    ) &
    slower=$!
fi
cat >"$dir/mpirun" <<EOF
#!/bin/sh
exec mpirun --allow-run-as-root --oversubscribe --bind-to none \\
    --mca plm_rsh_agent "$dir/agent" --mca plm_rsh_no_tree_spawn 1 \\
    --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "\$@"
EOF
chmod +x "$dir/mpirun"
if [ -n "$kill" ]; then
    ( # shellcheck disable=SC2086
        until ls $glob >/dev/null 2>&1; do sleep 0.1; done
        for p in $(ip netns pids "$pre-h$victim"); do kill -9 "$p" 2>/dev/null; done
        date +%s.%N >"$dir/killed"
    ) &
    watcher=$!
fi
snapshot() { # each host's processes (through /proc: ps is procps's), then TCP sockets; the
    # host a fault was put on first (the output is read from its top)
    order=$(i=0; while [ "$i" -lt "$hosts" ]; do echo "$i"; i=$((i + 1)); done |
        awk -v f="${slow:-${victim:-$cut}}" '$1 == f { print; next } { r = r " " $1 } END { print r }')
    for i in $order; do
        for p in $(ip netns pids "$pre-h$i" 2>/dev/null); do
            st=$(sed 's/^.*) \([A-Za-z]\).*/\1/' "/proc/$p/stat" 2>/dev/null)
            echo "  host $i: $p $st $(cat "/proc/$p/wchan" 2>/dev/null)" \
                "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)"
            for t in /proc/"$p"/task/*; do # each thread's innermost kernel frames
                sed -n '1,3{s/^\[<[0-9a-f]*>\] //;s/+0x.*//;p;}' "$t/stack" 2>/dev/null | paste -sd '<' -
            done | grep . | sort | uniq -c | sed 's/^/    /' | head -n 8
        done
    done
    for i in $order; do
        ip netns exec "$pre-h$i" ss -tanH 2>/dev/null | sed "s/^/  host $i tcp: /" | head -n 20
    done
}
# 2 s before the timeout's TERM, what every host runs (reported only if the timeout comes)
( sleep $((limit > 2 ? limit - 2 : 0)) & s=$!; trap 'kill $s; exit 0' TERM; wait $s; snapshot >"$dir/hung" 2>&1 ) &
dog=$!
if [ -n "$run" ]; then
    PT_HOSTFILE=$dir/hostfile PT_MPIRUN=$dir/mpirun ip netns exec "$pre-h0" \
        timeout -k 10 "$limit" "$@"
else
    ip netns exec "$pre-h0" timeout -k 10 "$limit" "$dir/mpirun" --hostfile "$dir/hostfile" \
        -n $((hosts * slots)) "$@"
fi
rc=$?
ended=$(date +%s.%N)
kill "$dog" 2>/dev/null
wait "$dog" 2>/dev/null
if [ -n "$slow" ]; then
    kill "$slower" 2>/dev/null
    wait "$slower" 2>/dev/null
    echo "hosts.sh: host $slow's ranks slowed by $(cat "$dir/slowcap")" >&2
fi
left() { # the processes still in the hosts' namespaces
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$pre-h"); do
        ip netns pids "$ns" 2>/dev/null
    done
}
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "hosts.sh: timeout after $limit s; what each host ran 2 s before it (pid, state," \
        "wait channel, command; its threads' kernel frames):" >&2
    cat "$dir/hung" >&2 2>/dev/null
fi
if [ -n "$down" ]; then
    kill "$cutter" 2>/dev/null
    if [ -s "$dir/down" ]; then
        i=0
        while [ -n "$(left)" ] && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
        gone=$(date +%s.%N)
        a=$(cat "$dir/down")
        m=$(awk -v a="$a" -v b="$ended" 'BEGIN { printf "%.1f", b - a }')
        if [ -z "$(left)" ]; then
            echo "hosts.sh: host $cut's link down; mpirun ended $m s later; every process gone" \
                "$(awk -v a="$a" -v b="$gone" 'BEGIN { printf "%.1f", b - a }') s later" >&2
        else
            echo "hosts.sh: host $cut's link down; mpirun ended $m s later; processes left 30 s after it:" >&2
            for p in $(left); do
                echo "  $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)" >&2
            done
        fi
    else
        echo "hosts.sh: host $cut's link never went down (no file matched $dglob)" >&2
    fi
fi
if [ -n "$kill" ]; then
    kill "$watcher" 2>/dev/null
    if [ -s "$dir/killed" ]; then
        echo "hosts.sh: host $victim killed; mpirun ended $(awk -v a="$(cat "$dir/killed")" \
            -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s later" >&2
    else
        echo "hosts.sh: host $victim was not killed (no file matched $glob)" >&2
    fi
fi
exit "$rc"
