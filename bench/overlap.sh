#!/bin/sh
# Progress of a started all-reduce while computing, across 2 hosts (network
# namespaces, Open MPI over TCP only: tests/hosts.sh) at several link rates:
# without MPI calls while computing, with pt_comm_test between compute slices,
# and each again with Open MPI's TCP progress thread (btl_tcp_progress_thread).
# One line per variant: exposed communication as a share of the blocking
# all-reduce's time (1: nothing hidden, 0: all hidden). Then training steps
# (dp 2) with pt_step_desc.overlap on and off at the same rates, with the time
# each was exposed to the dp communication. See bench/bench_overlap.c.
set -e
mb=${MB:-16}
for rate in ${RATES:-250mbit 1gbit 4gbit}; do
    for thread in 0 1; do
        echo "-- 2 hosts, $rate links, btl_tcp_progress_thread $thread"
        sh tests/hosts.sh --hosts 2 --rate "$rate" --timeout 300 -- \
            --mca btl_tcp_progress_thread "$thread" build/bench_overlap_mpi --mb "$mb" --reps 5 ||
            { rc=$?; [ "$rc" -eq 77 ] && exit 0; exit "$rc"; }
    done
done
# training steps (small preset, dp 2 across the 2 hosts): overlap on against off
for rate in ${RATES:-250mbit 1gbit 4gbit}; do
    echo "-- 2 hosts, $rate links: training steps, overlap on and off"
    sh tests/hosts.sh --hosts 2 --rate "$rate" --timeout 300 -- \
        build/bench_overlap_mpi --step --preset small --batch 8 --seq 128 --steps 4 ||
        { rc=$?; [ "$rc" -eq 77 ] && exit 0; exit "$rc"; }
done
# the same at 1 Gbit/s with a progress thread (an experiment of the bench, not the library's
# way: MPI_THREAD_MULTIPLE and MPI_Iprobe every 200 us)
echo "-- 2 hosts, 1gbit links: training steps, overlap on and off, a progress thread"
sh tests/hosts.sh --hosts 2 --rate 1gbit --timeout 300 -- \
    build/bench_overlap_mpi --step --preset small --batch 8 --seq 128 --steps 4 --progress-us 200 ||
    { rc=$?; [ "$rc" -eq 77 ] && exit 0; exit "$rc"; }
