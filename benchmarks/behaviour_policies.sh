#!/usr/bin/env bash
# Train (or continue training) the SAC behaviour policies of the dataset suite, one 1-thread
# process per env (two 1-thread processes beat one 2-thread process on 2 cores: results/speed.md,
# "Runs sharing the CPU").
# Resumable: rerun the same command after an interruption.
#   benchmarks/behaviour_policies.sh [OUT_DIR] [ENV ...]
set -euo pipefail
out=${1:-runs-behaviour}; shift || true
envs=("$@"); [ ${#envs[@]} -gt 0 ] || envs=(Hopper-v5 Walker2d-v5 HalfCheetah-v5)
mkdir -p "$out"
for env in "${envs[@]}"; do
  nohup python -m algos.sac --env-id "$env" --steps 1000000 --seed 0 --resume auto --run.threads 1 \
    --run.out-dir "$out" --log.wandb disabled --log.every 5000 --run.checkpoint-every 25000 \
    >> "$out/$env.log" 2>&1 &
  echo "$env: pid $! (log $out/$env.log)"
done
