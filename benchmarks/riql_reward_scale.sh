#!/usr/bin/env bash
# RIQL on clean data with rewards scaled as CORL's IQL scales them (--data.normalize-reward: r * 1000 /
# (max return - min return)), on the suite's three hopper datasets, 3 seeds, 100k bf16 steps: the grid's
# budget and options (benchmarks/grid.sh, class grid-fast) with that one option added, so its rows compare
# with the grid's riql-bf16 rows (RIQL's reference setting: raw rewards), which the table shows beside it
# with IQL's. Resumable (rerun after an interruption); run folders go to results/riql-reward-scale/runs
# (records committed, as the grid's).
#   JOBS=2 [GRID_RUNS=results/grid/runs/grid-fast] benchmarks/riql_reward_scale.sh [OUT_DIR]
#   DRY_RUN=1 benchmarks/riql_reward_scale.sh            # print the commands (the table's last), run nothing
set -euo pipefail
quoted() { printf "%q " "$@"; }  # a command line as it can be pasted back into a shell
run() {  # run a command, or with DRY_RUN=1 print it
  if [ "${DRY_RUN:-0}" = 1 ]; then echo "$(quoted "$@")"; else "$@"; fi
}
out=${1:-results/riql-reward-scale/runs}
grid=${GRID_RUNS:-results/grid/runs/grid-fast}
datasets=(offrl/hopper/medium-v0 offrl/hopper/medium-replay-v0 offrl/hopper/medium-expert-v0)
for ds in "${datasets[@]}"; do run python -m offrl.cli datasets make "$ds"; done
sweep=(python -m benchmarks.sweep --name riql-reward-scale --out-dir "$out" --datasets "${datasets[@]}" --seeds 0 1 2
       --steps 100000 --jobs "${JOBS:-2}" --threads 1
       --common "--eval.every 10000 --eval.episodes 10 --run.checkpoint-every 5000 --run.precision bf16"
       --variant "riql-rnorm-bf16=riql --data.normalize-reward")
run "${sweep[@]}"
# the table: this sweep's runs beside the grid's riql-bf16 (reference: raw rewards) and iql-bf16 runs on the
# same datasets, at the same budget and options
run python -m benchmarks.table "$out/riql-reward-scale" "$grid" --variants riql-rnorm-bf16 riql-bf16 iql-bf16 \
  --datasets "${datasets[@]}" --out results/riql-reward-scale/riql-reward-scale.md \
  --json results/riql-reward-scale/riql-reward-scale.json --plots results/riql-reward-scale/plots \
  --title "RIQL with and without CORL IQL's reward scaling, beside IQL, on the suite's hopper datasets, clean data, 100k bf16 steps" \
  --command "$(quoted "${sweep[@]}")(rows riql-rnorm-bf16); rows riql-bf16 and iql-bf16: the grid's runs in $grid (benchmarks/grid.sh, the command in results/grid/grid.md)"
