# Sourced by the shell checks that print a line a check (features_check.sh,
# guard_check.sh, text_train_check.sh), run from the repository's top:
# $dir, a scratch directory removed at exit; check WHAT CMD... (prints
# "ok: WHAT" or "FAIL: WHAT" and sets bad=1); has PATTERN FILE. The script
# ends with: exit "$bad".
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=0
check() {
    what=$1
    shift
    if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; bad=1; fi
}
has() { grep -q -- "$1" "$2"; }
