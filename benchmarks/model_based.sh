#!/usr/bin/env bash
# Model-based offline RL on offrl/hopper/medium-replay-v0: one dynamics ensemble (seed 0), its k-step
# error against the real simulator, then MOPO beside BC at one budget and MOBILE and RAVL at a smaller
# one, 3 seeds each, every model-based run on that same cached ensemble (--model-seed 0).
# Budgets are sized for a 2-core CPU without AVX-512 (python -m benchmarks.speed, one thread): a MOPO
# step took 31 ms, a MOBILE step 282 ms, a RAVL step 409 ms, and a rollout round (50k states x 5 model
# steps, every 1000 steps) 25 s; the paper's budget is 3M steps. On a 2-core Xeon with AVX-512 the whole
# script took about 70 minutes (the model 20, then two or three runs at a time) with other work beside
# it. The ensemble's training is capped at MODEL_EPOCHS epochs (no cap: early stopping only, which had not stopped by epoch 92 here).
#   JOBS=2 benchmarks/model_based.sh [OUT_DIR]
set -euo pipefail
quoted() { printf "%q " "$@"; }  # a command line as it can be pasted back into a shell
out=${1:-runs-bench}
jobs=${JOBS:-2}
steps=${STEPS:-30000}
slow_steps=${SLOW_STEPS:-2000}
model_epochs=${MODEL_EPOCHS:-120}
ds=offrl/hopper/medium-replay-v0
model=(--model.max-epochs "$model_epochs")
python -m offrl.cli datasets make "$ds"
mkdir -p "$out"
python -m world_models.train --dataset "$ds" --seed 0 "${model[@]}" | tee "$out/model-train.out"
model_file=$(sed -n 's/^model: //p' "$out/model-train.out")
python -m world_models.evaluate --dataset "$ds" --model "$model_file" --out results/model-error-hopper-mr
fast=(python -m benchmarks.sweep --name model-based-mr --out-dir "$out" --datasets "$ds" --seeds 0 1 2
      --steps "$steps" --jobs "$jobs" --common "--eval.every 5000 --eval.episodes 10"
      --variant bc=bc --variant "mopo=mopo --model-seed 0 --model.max-epochs $model_epochs")
slow=(python -m benchmarks.sweep --name model-based-mr-slow --out-dir "$out" --datasets "$ds" --seeds 0 1 2
      --steps "$slow_steps" --jobs "$jobs" --common "--eval.every 1000 --eval.episodes 10 --run.checkpoint-every 250"
      --variant "mobile=mobile --model-seed 0 --model.max-epochs $model_epochs"
      --variant "ravl=ravl --model-seed 0 --model.max-epochs $model_epochs")
"${fast[@]}"
"${slow[@]}"
python -m benchmarks.table "$out/model-based-mr" "$out/model-based-mr-slow" --out results/model-based-medium-replay.md \
  --json results/model-based-medium-replay.json --plots results/model-based-medium-replay \
  --title "MOPO beside BC ($steps steps), MOBILE and RAVL ($slow_steps steps) on $ds; the papers train 3M steps" \
  --command "$(quoted "${fast[@]}"); $(quoted "${slow[@]}")"
