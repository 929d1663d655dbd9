#!/usr/bin/env bash
# Bad numbers on the benchmarks' command lines are a usage error naming the
# flag (exit status 2), never a silent 0 or a default measured instead.
# usage: cli_errors.sh <directory holding the bench_* binaries>
set -u
dir=$1
fail=0
expect() {  # expect TEXT command...
  local text=$1
  shift
  local out
  out=$("$@" 2>&1)
  local got=$?
  if [ "$got" != 2 ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* -> status $got (want 2), output: $(tail -n 2 <<<"$out")"
    fail=1
  else
    echo "ok: $* -> 2"
  fi
}
expect "--r takes a whole number from 1 to 4096, got 'abc'" "$dir/bench_semiseparable" --r abc
expect "usage:" "$dir/bench_semiseparable" --help
expect "--min-log2 5 is above --max-log2 4" "$dir/bench_semiseparable" --min-log2 5 --max-log2 4
expect "--reps takes a whole number from 1" "$dir/bench_nn" --reps 0
expect "--n takes a whole number >= 1, got '1e3'" "$dir/bench_attention" --n 1e3
expect "--threads takes a whole number from 0" "$dir/bench_attention" --threads -2
expect "--rounds takes a whole number from 1" "$dir/bench_remat" --rounds x
expect "--max-states takes a whole number >= 1" "$dir/bench_remat" --max-states 99999999999999999999
expect "--only takes T,K,C" "$dir/bench_semicrf" --only 1,2
expect "--only takes T,K,C" "$dir/bench_semicrf" --only 1,2,3x
expect "--ops takes a whole number from 4" "$dir/bench_overhead" --ops 3
expect "usage:" "$dir/bench_overhead" --profile relu --steps
expect "--reps takes a whole number from 1" "$dir/bench_cuda" --reps -1
expect "--reps takes a whole number from 1" "$dir/bench_conv" --reps 0
expect "--threads takes a whole number from 1 to 256" "$dir/bench_conv" --threads 300
expect "usage:" "$dir/bench_conv" --bogus
expect "--seq takes a whole number from 2" "$dir/bench_rnn" --seq 1
expect "--layers takes a whole number from 1 to 16" "$dir/bench_rnn" --layers 0
expect "usage:" "$dir/bench_rnn" --bogus
exit $fail
