#!/usr/bin/env bash
# Issue 4's benchmark, resumable (rerun after an interruption):
#  (a) on hopper medium-replay, IQL and CQL against BC, 3 seeds;
#  (b) with 30% random next-observation corruption, how much score RIQL and IQL lose.
# Budgets are sized for 2 CPU cores, one 1-thread run per core (ms/update at 1 thread: BC ~1.4,
# IQL ~7, RIQL ~15, CQL ~190): 100k steps for BC/IQL/RIQL, 30k for CQL. The tables state them.
# RIQL uses its paper's hopper setting for corrupted dynamics (sigma 1.0, quantile 0.5; FACTS.md 5).
#   benchmarks/value_based.sh [OUT_DIR]
set -euo pipefail
out=${1:-runs-bench}
ds=offrl/hopper/medium-replay-v0
corrupt="--data.corrupt next_observations --data.corruption-rate 0.3 --data.corruption-range 1.0"
common="--eval.every 10000 --eval.episodes 10"
offrl datasets make "$ds" 2>/dev/null || true

sweep_a=(python -m benchmarks.sweep --name value-mr --out-dir "$out" --datasets "$ds" --seeds 0 1 2 --steps 100000
         --jobs 2 --common "$common" --variant bc=bc --variant iql=iql)
"${sweep_a[@]}"
sweep_b=(python -m benchmarks.sweep --name corruption-mr --out-dir "$out" --datasets "$ds" --seeds 0 1 2 --steps 100000
         --jobs 2 --common "$common" --variant "iql-clean=iql" --variant "iql-corrupt30=iql $corrupt"
         --variant "riql-clean=riql --sigma 1.0 --quantile 0.5" --variant "riql-corrupt30=riql --sigma 1.0 --quantile 0.5 $corrupt")
"${sweep_b[@]}"
sweep_c=(python -m benchmarks.sweep --name cql-mr --out-dir "$out" --datasets "$ds" --seeds 0 1 2 --steps 30000
         --jobs 2 --common "--eval.every 5000 --eval.episodes 10" --variant cql=cql)
"${sweep_c[@]}"

python -m benchmarks.table "$out/value-mr" --out results/value-based-medium-replay.md \
  --title "IQL vs BC on offrl/hopper/medium-replay-v0" --command "${sweep_a[*]}"
python -m benchmarks.table "$out/cql-mr" --out results/cql-medium-replay.md \
  --title "CQL on offrl/hopper/medium-replay-v0 (compare with BC in value-based-medium-replay.md)" --command "${sweep_c[*]}"
python -m benchmarks.table "$out/corruption-mr" --out results/corruption-medium-replay.md \
  --title "30% random next-observation corruption: IQL vs RIQL on offrl/hopper/medium-replay-v0" --command "${sweep_b[*]}"
