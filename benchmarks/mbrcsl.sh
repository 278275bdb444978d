#!/usr/bin/env bash
# MBRCSL on the point-maze stitching dataset beside RCSL and BC (3 seeds), and MBRCSL on one suite dataset
# (hopper medium-replay), into results/mbrcsl-stitching.md (+ .json, plots) with the rollout counts of every
# MBRCSL run. Resumable: rerun the same command and finished runs are skipped, interrupted ones continue.
#   JOBS=2 benchmarks/mbrcsl.sh [OUT_DIR]
# Budgets (env overrides): STEPS gradient steps for BC, RCSL and MBRCSL's RCSL phase (early stopping may end
# RCSL sooner), BEHAVIOUR_STEPS for MBRCSL's diffusion policy, MODEL_EPOCHS caps the dynamics ensemble's
# training (one model per seed on the maze: --model-seed defaults to the run's seed), HOPPER_SEEDS and
# HOPPER_ROLLOUT_EPOCHS for the suite dataset (its 1000-step rollouts cost about 40 s per 200 rollouts here).
# On hopper medium-replay no rollout beat the data's best return (2222; best rollout 1607, 90th percentile
# 800 over 1000 rollouts per seed), so the variant mbrcsl-t1000 reuses each seed's behaviour policy with a
# fixed --threshold HOPPER_THRESHOLD (1000), a value chosen after seeing that.
set -euo pipefail
quoted() { printf "%q " "$@"; }
out=${1:-runs-bench}
jobs=${JOBS:-2}
steps=${STEPS:-10000}
behaviour_steps=${BEHAVIOUR_STEPS:-10000}
model_epochs=${MODEL_EPOCHS:-60}
maze=offrl/pointmaze/umaze-stitch-v0
hopper=offrl/hopper/medium-replay-v0
python -m offrl.cli datasets make "$maze" || true  # already there: fine
maze_sweep=(python -m benchmarks.sweep --name mbrcsl-maze --out-dir "$out" --datasets "$maze" --seeds 0 1 2
            --steps "$steps" --jobs "$jobs" --common "--eval.every 2000 --eval.episodes 10"
            --variant bc=bc --variant rcsl=rcsl
            --variant "mbrcsl=mbrcsl --behaviour.steps $behaviour_steps --model.max-epochs $model_epochs")
hopper_sweep=(python -m benchmarks.sweep --name mbrcsl-hopper-mr --out-dir "$out" --datasets "$hopper"
              --seeds ${HOPPER_SEEDS:-0 1 2} --steps "$steps" --jobs "$jobs" --common "--eval.episodes 10"
              --variant "mbrcsl=mbrcsl --behaviour.steps $behaviour_steps --model-seed 0 --model.max-epochs 120 --max-rollout-epochs ${HOPPER_ROLLOUT_EPOCHS:-10}"
              --variant "mbrcsl-t1000=mbrcsl --behaviour-policy $out/mbrcsl-hopper-mr/mbrcsl/mbrcsl/offrl-hopper-medium-replay-v0/{seed}-sweep/behaviour.pt --threshold ${HOPPER_THRESHOLD:-1000} --model-seed 0 --model.max-epochs 120 --max-rollout-epochs ${HOPPER_ROLLOUT_EPOCHS:-10}")
"${maze_sweep[@]}" || echo "maze sweep: some runs failed (an MBRCSL run with no rollout above the threshold exits 1)"
"${hopper_sweep[@]}" || echo "hopper sweep: some runs failed (an MBRCSL run with no rollout above the threshold exits 1)"
python -m benchmarks.table "$out/mbrcsl-maze" "$out/mbrcsl-hopper-mr" --metric eval/normalized_score \
  --metric behaviour/normalized_score --metric eval/return_mean --out results/mbrcsl-stitching.md \
  --json results/mbrcsl-stitching.json --plots results/mbrcsl-stitching \
  --title "MBRCSL beside RCSL and BC on the point-maze stitching data ($steps steps; MBRCSL's diffusion policy $behaviour_steps steps), and MBRCSL on $hopper" \
  --command "$(quoted "${maze_sweep[@]}"); $(quoted "${hopper_sweep[@]}")"
{
  echo
  echo "### MBRCSL's rollouts per run"
  echo
  echo "Made in the learned model by the diffusion policy from the data's initial states; kept when the return"
  echo "exceeds the threshold (the data's best episode return). RCSL trains on the kept ones only and is"
  echo "conditioned on the best kept return (RCSL target). From each run's final.json:"
  echo "\`python -m benchmarks.rollout_counts $out/mbrcsl-maze $out/mbrcsl-hopper-mr\`."
  echo
  python -m benchmarks.rollout_counts "$out/mbrcsl-maze" "$out/mbrcsl-hopper-mr"
} >> results/mbrcsl-stitching.md
