#!/usr/bin/env bash
# Issue 4's benchmark on offrl/hopper/medium-replay-v0, 3 seeds, resumable (rerun after an interruption):
#  (a) IQL and CQL against BC;
#  (b) with 30% random next-observation corruption (scale 1.0), how much score IQL and RIQL lose.
# IQL also runs under --run.precision bf16, as a check that bf16 autocast (which CQL uses here) learns
# what fp32 does.
# Budgets are sized for 2 CPU cores, one 1-thread run per core (ms/update at 1 thread, results/speed.md:
# BC 1.3, IQL 7.1, RIQL 12.1, CQL 168 in fp32; CQL 66 under --run.precision bf16, speed-bf16.md):
# 30k gradient steps for BC/IQL/RIQL in fp32 and 20k for CQL in bf16, far below the papers' 1M; the
# table states them. RIQL uses its paper's hopper setting for corrupted dynamics (sigma 1.0, quantile
# 0.5; docs/FACTS.md 5).
# On a machine with a GPU and more cores, the CPU-bound runs and CQL can go side by side (PARALLEL_SWEEPS=1;
# without it the two sweeps run one after the other):
#   PARALLEL_SWEEPS=1 JOBS=13 DEVICE=cpu CQL_JOBS=3 CQL_DEVICE=cuda benchmarks/value_based.sh [OUT_DIR]
#   JOBS=2 benchmarks/value_based.sh [OUT_DIR]
set -euo pipefail
quoted() { printf "%q " "$@"; }  # a command line as it can be pasted back into a shell
out=${1:-runs-bench}
jobs=${JOBS:-2}
device=${DEVICE:-auto}
cql_jobs=${CQL_JOBS:-$jobs}
cql_device=${CQL_DEVICE:-$device}
ds=offrl/hopper/medium-replay-v0
corrupt="--data.corrupt next_observations --data.corruption-rate 0.3 --data.corruption-range 1.0"
python -m offrl.cli datasets make "$ds"

sweep_a=(python -m benchmarks.sweep --name value-mr --out-dir "$out" --datasets "$ds" --seeds 0 1 2 --steps 30000
         --jobs "$jobs" --common "--eval.every 5000 --eval.episodes 10 --run.checkpoint-every 2000 --device $device"
         --variant bc=bc --variant iql=iql --variant "iql-bf16=iql --run.precision bf16"
         --variant "iql-corrupt30=iql $corrupt"
         --variant "riql=riql --sigma 1.0 --quantile 0.5" --variant "riql-corrupt30=riql --sigma 1.0 --quantile 0.5 $corrupt")
sweep_b=(python -m benchmarks.sweep --name cql-mr-bf16 --out-dir "$out" --datasets "$ds" --seeds 0 1 2 --steps 20000
         --jobs "$cql_jobs" --common "--eval.every 2500 --eval.episodes 10 --run.checkpoint-every 500 --run.precision bf16 --device $cql_device"
         --variant cql=cql)
if [ "${PARALLEL_SWEEPS:-0}" = 1 ]; then  # both sweeps at once (enough cores for JOBS + CQL_JOBS)
  "${sweep_a[@]}" & a=$!
  "${sweep_b[@]}" & b=$!
  wait $a; wait $b
else
  "${sweep_a[@]}"
  "${sweep_b[@]}"
fi

python -m benchmarks.table "$out/value-mr" "$out/cql-mr-bf16" --out results/value-based-medium-replay.md \
  --title "BC, IQL, CQL and RIQL on $ds, clean and with 30% random next-observation corruption" \
  --command "$(quoted "${sweep_a[@]}"); $(quoted "${sweep_b[@]}")"
