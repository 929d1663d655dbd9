#!/usr/bin/env bash
# usage: run.sh <dist_check> <np> <mode> [args...]
#        run.sh <dist_check> <np> resume <np-after>   (ZeRO-1 saved at step 25 with np ranks, resumed with np-after)
# Runs dist_check under mpirun (as root if need be, oversubscribing the cores)
# and checks what the mode promises:
#   collectives | train ...: every rank prints "ok"; train runs twice and the
#                            parameter hashes must match (bit-identical runs);
#   kill: the surviving ranks print the timeout ad::Error and the job ends;
#   kill_inflight work|dp: a rank dies with collectives in flight; the survivor
#                          gets the timeout ad::Error within 3 x the timeout
#                          (2 s) and reports ok (np 2).
set -uo pipefail
bin=$1 np=$2 mode=$3
shift 3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
launch() { timeout 120 mpirun -np "$np" --mca orte_abort_on_non_zero_status 0 "$bin" "$mode" "$@" 2>&1; }
launch_as() { local n=$1; shift; timeout 120 mpirun -np "$n" --mca orte_abort_on_non_zero_status 0 "$bin" "$@" 2>&1; }
case "$mode" in
  resume)
    file=$(mktemp --suffix=.safetensors)
    trap 'rm -f "$file"' EXIT
    out=$(timeout 120 mpirun -np "$np" --mca orte_abort_on_non_zero_status 0 "$bin" train 50 keep_all zero "save:$file@25" 2>&1) \
      || { echo "$out"; echo "FAIL: the saving run"; exit 1; }
    echo "$out"
    np0=$np np=$1
    out=$(launch_as "$np" train 50 keep_all zero "resume:$file") || { echo "$out"; echo "FAIL: the resumed run"; exit 1; }
    echo "$out"
    [ "$(grep -c 'resumed at step 25 .* ok$' <<<"$out")" -eq "$np" ] || { echo "FAIL: not every resumed rank ok"; exit 1; }
    echo "PASS: saved with $np0 ranks, resumed with $np, equal to uninterrupted single-process training"
    ;;
  kill)
    out=$(launch "$@"); rc=$?
    echo "$out"
    [ $rc -ne 124 ] || { echo "FAIL: mpirun hung"; exit 1; }
    n=$(grep -c "ad::Error after .*no progress for 3000 ms" <<<"$out")
    [ "$n" -ge 1 ] || { echo "FAIL: no rank reported the timeout error"; exit 1; }
    ! grep -q "FAIL" <<<"$out" || exit 1
    echo "PASS: $n surviving rank(s) failed with the timeout error"
    ;;
  kill_inflight)
    out=$(launch "$@"); rc=$?
    echo "$out"
    [ $rc -ne 124 ] || { echo "FAIL: mpirun hung"; exit 1; }
    ! grep -q "FAIL" <<<"$out" || exit 1
    grep -q "ad::Error after .*no progress for 2000 ms" <<<"$out" || { echo "FAIL: no rank reported the timeout error"; exit 1; }
    grep -q "kill_inflight $1 ok$" <<<"$out" || { echo "FAIL: the survivor did not report ok"; exit 1; }
    echo "PASS: the survivor failed with the timeout error after one timeout, and the communicator refused more"
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
