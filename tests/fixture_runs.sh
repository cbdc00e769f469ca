# fixture_runs.sh -- sourced by layouts_check.sh and the pipeline_*_check.sh
# scripts with prog and file set: launch (thread ranks, or mpirun for *_mpi
# programs), try (one layout, counted in runs and bad; with PROBE=1 only
# counted), finish (the count line and the exit status: 77 where nothing
# fits, a skip and never a pass), and the fixture's shape in nh (heads), kv
# (key/value heads), L (layers) and B (batch), read from fixture_check's
# first line. FIXTURE_ARGS (e.g. "--precision bf16") goes to every run.
mpi=""
case "$prog" in
*_mpi) # Open MPI as root, more ranks than cores (../shared/ENVIRONMENT.md)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    mpi="mpirun --allow-run-as-root --oversubscribe --bind-to none -n" ;;
esac
launch() { # launch NRANKS PROG ARGS...
    n=$1
    shift
    if [ -n "$mpi" ]; then timeout 60 $mpi "$n" "$@"; else timeout 60 "$@"; fi
}
runs=0 bad=0
try() { # try NRANKS ARGS...: fixture_check on NRANKS ranks with ARGS, at most max ranks
    n=$1
    shift
    [ "$n" -le "$max" ] || return 0
    runs=$((runs + 1))
    if ! out=$(launch "$n" $prog "$file" $FIXTURE_ARGS "$@" 2>&1); then
        bad=$((bad + 1))
        echo "FAIL $*"
        echo "$out" | grep -E "FAIL|error" | head -n 5
    fi
}
if [ -n "$PROBE" ]; then try() { runs=$((runs + 1)); }; fi
finish() { # finish WHAT: e.g. "pipeline layouts"
    echo "$runs $1 of $(basename "$file") (n_layer=$L, n_head=$nh, B=$B), $bad failed"
    [ "$runs" -gt 0 ] || { echo "SKIP: no $1 fit $(basename "$file")"; exit 77; }
    [ -z "$PROBE" ] || exit 0
    [ "$bad" -eq 0 ]
}
head=$(launch 1 $prog "$file" $FIXTURE_ARGS 2>&1 | head -n 1)
nh=$(echo "$head" | sed -n 's/.* n_head=\([0-9]*\) .*/\1/p')
L=$(echo "$head" | sed -n 's/.* n_layer=\([0-9]*\) .*/\1/p')
B=$(echo "$head" | sed -n 's/.* B=\([0-9]*\) .*/\1/p')
kv=$(echo "$head" | sed -n 's/.* n_kv_head=\([0-9]*\) .*/\1/p')
kv=${kv:-$nh} # tensor parallelism divides the key/value heads (n_head without GQA)
[ -n "$nh" ] && [ -n "$L" ] && [ -n "$B" ] || { echo "cannot read the fixture's shape: $head"; exit 1; }
