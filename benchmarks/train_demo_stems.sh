#!/usr/bin/env bash
# How the demo model was chosen: test accuracy on the 2,000 held-out digits and training time of hybrid
# designs on the built-in digits. Writes benchmarks/results/train_demo_stems.jsonl (one JSON summary per
# run, with its command).
#   Stage 1: equal epochs, 1 process x 1 thread, two runs side by side (accuracy per epoch; times are
#            of a shared machine).
#   Stage 2: the demo's own setting (2 processes x 1 thread, the whole 2-core machine), one run at a time.
#   Stage 3: speed on the whole machine, 2 epochs: 2 processes x 1 thread, 1 x 2, 1 x 1.
# Usage: benchmarks/train_demo_stems.sh [1|2|3]   (stage 1 takes about 15 minutes, 2 about 15, 3 about 4)
set -euo pipefail
cd "$(dirname "$0")/.."
VITKIT=${VITKIT:-vitkit}
OUT=${OUT:-/tmp/vitkit_demo_stems}
RES=benchmarks/results/train_demo_stems.jsonl
mkdir -p "$OUT"
OLD="--set model_args.depth=4 --set model_args.stem_width=16 --set model_args.stem_convs=0"  # the previous demo model
X1="--set model_args.stem_width=32 --set model_args.stem_convs=1"

run() {  # run NAME ARGS...: one training run; its summary, command and wall time appended to $RES
  local name=$1; shift
  python3 benchmarks/record_run.py "$RES" "$name" $VITKIT train --quiet --json --out $OUT/$name $*
}

stage=${1:-1}
if [ "$stage" = 1 ]; then
  S1="--nproc 1 --threads 1 --max-minutes 0"
  run old_e10 $S1 --epochs 10 $OLD & run x1_d3_e10 $S1 --epochs 10 $X1 --set model_args.depth=3 & wait
  run x2_d3_e10 $S1 --epochs 10 $X1 --set model_args.stem_convs=2 --set model_args.depth=3 & \
    run x1_d3_e14 $S1 --epochs 14 $X1 --set model_args.depth=3 & wait
  run x1_d2_e14 $S1 --epochs 14 $X1 --set model_args.depth=2
elif [ "$stage" = 3 ]; then
  for d in 2 3; do
    for mode in "--nproc 2 --threads 1" "--nproc 1 --threads 2" "--nproc 1 --threads 1"; do
      run "speed_d${d}_$(echo "$mode" | sed 's/--nproc /p/; s/ --threads /t/')" --epochs 2 --max-minutes 0 $X1 \
        --set model_args.depth=$d $mode
    done
  done
else
  run demo_d2_e20 --epochs 20 $X1 --set model_args.depth=2
  run demo_d3_e18 --epochs 18 $X1 --set model_args.depth=3
  run demo_d2_e20_seed1 --epochs 20 --seed 1 $X1 --set model_args.depth=2
  run demo_d2_e20_seed2 --epochs 20 --seed 2 $X1 --set model_args.depth=2
fi
