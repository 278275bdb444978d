#!/usr/bin/env bash
# CQL on offrl/hopper/medium-replay-v0 with plain-MSE Bellman terms and raw states (the official
# code's loss and preprocessing), beside BC and IQL at the same budget, 3 seeds, fp32.
# The budget is sized for a 2-core CPU without AVX-512 (no native bfloat16, so no --run.precision
# bf16): a CQL update took 537 ms there at one thread (python -m benchmarks.speed --algos cql
# --threads 1), so 4k steps per seed, far below the paper's 1M; the table states it.
#   JOBS=2 benchmarks/cql_after_fix.sh [OUT_DIR]
set -euo pipefail
quoted() { printf "%q " "$@"; }  # a command line as it can be pasted back into a shell
out=${1:-runs-bench}
jobs=${JOBS:-2}
steps=${STEPS:-4000}
ds=offrl/hopper/medium-replay-v0
python -m offrl.cli datasets make "$ds"
sweep=(python -m benchmarks.sweep --name cql-after-fix --out-dir "$out" --datasets "$ds" --seeds 0 1 2 --steps "$steps"
       --jobs "$jobs" --spread-threads --common "--eval.every 1000 --eval.episodes 10 --run.checkpoint-every 250"
       --variant cql=cql --variant bc=bc --variant iql=iql)
"${sweep[@]}"
python -m benchmarks.table "$out/cql-after-fix" --out results/cql-medium-replay-4k.md \
  --title "CQL (plain-MSE Bellman term, raw states) beside BC and IQL on $ds, $steps steps" \
  --command "$(quoted "${sweep[@]}")"
