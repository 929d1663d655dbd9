#!/usr/bin/env bash
# Bad command lines of the examples end with a message and exit status 1 or 2,
# never an abort: usage errors exit 2, run-time errors 1.
# usage: cli_errors.sh <toolkit> <train_lm> <semicrf_segment> <mlp> <remat_demo> <dist_mlp> <cnn> <rnn>
set -u
toolkit=$1 train_lm=$2 semicrf=$3 mlp=$4 remat=$5 dist=$6 cnn=$7 rnn=$8
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
expect 2 "--steps takes a whole number >= 1" "$toolkit" --steps 99999999999999999999

# numbers: the whole argument, in range (out of 64 bits too), else a message naming the flag
expect 2 "--lr takes a number > 0" "$train_lm" --lr abc
expect 2 "--steps takes a whole number >= 1" "$train_lm" --steps 0
expect 2 "--steps takes a whole number >= 1" "$train_lm" --steps 99999999999999999999
expect 2 "--batch takes a whole number >= 1" "$train_lm" --batch 0
expect 2 "--eval takes a whole number >= 0" "$train_lm" --eval -5
expect 2 "--log-every takes a whole number >= 1" "$train_lm" --log-every -3
expect 2 "--seed takes a whole number from 0 to" "$train_lm" --seed -1
expect 2 "--budget takes a whole number from 1 to 8796093022207" "$train_lm" --policy budget --budget 99999999999999
expect 2 "--digits takes a whole number from 1 to" "$train_lm" --digits 4611686018427387904
expect 2 "--policy uniform:K takes a whole number >= 1" "$train_lm" --policy uniform:0
expect 2 "--task takes sort or reverse, got 'bogus'" "$train_lm" --task bogus
expect 2 "--mixer takes attention or semiseparable" "$train_lm" --mixer bogus
expect 2 "--save-every applies with --save only" "$train_lm" --save-every 5
expect 2 "--stop-at takes a whole number >= 1" "$train_lm" --stop-at -1
expect 2 "applies to chain graphs only" "$train_lm" --policy optimal:4
expect 2 "--policy budget needs --budget" "$train_lm" --policy budget
expect 2 "--epochs takes a whole number >= 1" "$mlp" --epochs abc
expect 2 "--seed takes a whole number from 0 to" "$mlp" --seed xyz
expect 2 "--steps takes a whole number from 2 to 10000" "$remat" --steps abc
expect 2 "--seed takes a whole number from 0 to" "$remat" --seed xyz
expect 2 "--steps takes a whole number >= 1" "$dist" --steps abc
expect 2 "--length takes a whole number >= 1" "$semicrf" --length 0
expect 2 "--epochs takes a whole number from 1 to 1000" "$cnn" --epochs 0
expect 2 "unknown --policy 'foo'" "$cnn" --policy foo
expect 2 "--policy budget and --budget KiB go together" "$cnn" --policy budget
expect 1 "is below the least peak" "$cnn" --policy budget --budget 1 --epochs 1
expect 2 "unknown --cell 'tcn'" "$rnn" --cell tcn
expect 2 "--delay (9) must be less than --seq (9)" "$rnn" --seq 9 --delay 9
expect 2 "--seq takes a whole number from 2 to" "$rnn" --seq 1
expect 2 "--policy budget and --budget KiB go together" "$rnn" --budget 64
expect 2 "usage:" "$rnn" --steps
expect 1 "is below the least peak" "$rnn" --policy budget --budget 1 --steps 1 --seq 16
expect 2 "--length takes a whole number >= 1" "$semicrf" --length abc

# memory: sizes beyond any address space fail at once, before training (timeout: not after a long run)
expect 1 "error: out of host memory" "$semicrf" --length 1000000000000 --epochs 0
lm=(--batch 16 --digits 6 --layers 1 --dim 32 --log-every 4)
expect 1 "error: --batch 1000000000000000: out of host memory" timeout 60 "$train_lm" --batch 1000000000000000 --eval 0
expect 1 "error: --eval 1000000000000000: out of host memory" \
  timeout 60 "$train_lm" "${lm[@]}" --steps 1000000 --eval 1000000000000000

# --save: checked before training, leaving no file behind and an existing one as it was
expect 1 "cannot create a file in its directory" timeout 60 "$train_lm" "${lm[@]}" --steps 1000000 --eval 0 \
  --save cli_no_such_dir/lm.safetensors
expect 1 "is a directory" "$train_lm" "${lm[@]}" --steps 1 --eval 0 --save .
echo keep >cli_keep.safetensors
expect 1 "cannot open" "$train_lm" "${lm[@]}" --steps 1 --eval 0 --save cli_keep.safetensors --resume cli_none.safetensors
if [ "$(cat cli_keep.safetensors)" != keep ] || compgen -G ".train_lm-probe-*" >/dev/null; then
  echo "FAIL: --save's check changed cli_keep.safetensors or left a probe file"
  fail=1
else
  echo "ok: --save's check left cli_keep.safetensors as it was and no probe file"
fi

# --resume: a checkpoint whose metadata lacks step or data_offset, or whose step is not a number
# (the header edited in place, its length unchanged)
rm -f cli_lm.safetensors
expect 0 "params-hash" "$train_lm" "${lm[@]}" --steps 12 --eval 0 --save cli_lm.safetensors
edit() {  # edit FROM TO OUT: cli_lm.safetensors with FROM replaced by TO (same length), as OUT
  LC_ALL=C sed "s/$1/$2/" cli_lm.safetensors >"$3"
}
edit '"step":"12"' '"stap":"12"' cli_nostep.safetensors
edit '"data_offset":' '"data_offsex":' cli_nooffset.safetensors
edit '"step":"12"' '"step":"ab"' cli_badstep.safetensors
edit '"step":"12"' '"step":"-1"' cli_negstep.safetensors
expect 1 "--resume cli_nostep.safetensors: the checkpoint's metadata has no step" \
  "$train_lm" "${lm[@]}" --steps 12 --eval 0 --resume cli_nostep.safetensors
expect 1 "--resume cli_nooffset.safetensors: the checkpoint's metadata has no data_offset" \
  "$train_lm" "${lm[@]}" --steps 12 --eval 0 --resume cli_nooffset.safetensors
expect 1 "--resume cli_badstep.safetensors: the checkpoint's step is 'ab', not a whole number >= 0" \
  "$train_lm" "${lm[@]}" --steps 12 --eval 0 --resume cli_badstep.safetensors
expect 1 "--resume cli_negstep.safetensors: the checkpoint's step is '-1', not a whole number >= 0" \
  "$train_lm" "${lm[@]}" --steps 12 --eval 0 --resume cli_negstep.safetensors
exit $fail
