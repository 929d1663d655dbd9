#!/usr/bin/env bash
# Bad command lines of the examples end with a message and exit status 1 or 2,
# never an abort. usage: cli_errors.sh <toolkit> <train_lm> <semicrf_segment>
set -u
toolkit=$1 train_lm=$2 semicrf=$3
fail=0
expect() {  # expect STATUS TEXT command...
  local want=$1 text=$2
  shift 2
  local out
  out=$("$@" 2>&1)
  local got=$?
  if [ "$got" != "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* -> status $got (want $want), output: $(tail -n 2 <<<"$out")"
    fail=1
  else
    echo "ok: $* -> $got"
  fi
}
rm -f cli_toolkit.safetensors
expect 0 "final loss" "$toolkit" --steps 5 --checkpoint cli_toolkit.safetensors
expect 1 "is from a run of --steps 5" "$toolkit" --steps 6 --checkpoint cli_toolkit.safetensors --resume
expect 0 "nothing to do" "$toolkit" --steps 5 --checkpoint cli_toolkit.safetensors --resume
expect 2 "--lr takes a number > 0" "$train_lm" --lr abc
expect 2 "--steps takes a step count >= 1" "$train_lm" --steps 0
expect 2 "--save-every applies with --save only" "$train_lm" --save-every 5
expect 2 "--stop-at takes a step >= 1" "$train_lm" --stop-at -1
expect 1 "applies to chain graphs only" "$train_lm" --policy optimal:4
expect 2 "usage: semicrf_segment" "$semicrf" --length 0
expect 2 "usage: semicrf_segment" "$semicrf" --length abc
expect 1 "error: out of host memory" "$semicrf" --length 1000000000000 --epochs 0
exit $fail
