#!/usr/bin/env bash
# usage: run.sh <dist_check> <np> <mode> [args...]
# Runs dist_check under mpirun (as root if need be, oversubscribing the cores)
# and checks what the mode promises:
#   collectives | train ...: every rank prints "ok"; train runs twice and the
#                            parameter hashes must match (bit-identical runs);
#   kill: the surviving ranks print the timeout ad::Error and the job ends.
set -uo pipefail
bin=$1 np=$2 mode=$3
shift 3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
launch() { timeout 120 mpirun -np "$np" --mca orte_abort_on_non_zero_status 0 "$bin" "$mode" "$@" 2>&1; }
case "$mode" in
  kill)
    out=$(launch "$@"); rc=$?
    echo "$out"
    [ $rc -ne 124 ] || { echo "FAIL: mpirun hung"; exit 1; }
    n=$(grep -c "ad::Error after .*no progress for 3000 ms" <<<"$out")
    [ "$n" -ge 1 ] || { echo "FAIL: no rank reported the timeout error"; exit 1; }
    ! grep -q "FAIL" <<<"$out" || exit 1
    echo "PASS: $n surviving rank(s) failed with the timeout error"
    ;;
  *)
    out=$(launch "$@"); rc=$?
    echo "$out"
    [ $rc -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
    [ "$(grep -c ': .* ok$' <<<"$out")" -eq "$np" ] || { echo "FAIL: not every rank reported ok"; exit 1; }
    if [ "$mode" = train ]; then
      again=$(launch "$@") || { echo "$again"; echo "FAIL: second run"; exit 1; }
      h1=$(grep -o 'params-hash [0-9a-f]*' <<<"$out" | sort -u)
      h2=$(grep -o 'params-hash [0-9a-f]*' <<<"$again" | sort -u)
      [ "$(wc -l <<<"$h1")" -eq 1 ] && [ "$h1" = "$h2" ] || { echo "FAIL: runs differ: $h1 / $h2"; exit 1; }
      echo "PASS: two runs bit-identical ($h1)"
    fi
    ;;
esac
