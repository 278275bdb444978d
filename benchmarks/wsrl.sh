#!/usr/bin/env bash
# Offline-to-online fine-tuning on offrl/hopper/medium-v0: CQL pre-trained with WSRL's locomotion recipe
# (10 LayerNorm critics, a 2-of-10 target, max-target backup), then four online variants from the same
# checkpoints, same env-step budget and seeds: WSRL (warm-up, no offline data), retaining the offline data
# (ratio 0.5), no warm-up, and SAC from scratch. Learning curves (PNG) and a table into results/.
# The paper runs 250k offline and 500k online steps. On a 2-core AMD EPYC with AVX512-BF16 at one thread, a
# pre-training step (10 LayerNorm critics on the data, the 2 drawn ones on CQL's 30 x 256 sampled actions) took
# ~175 ms in float32 with the other core idle, and 171 ms a step over 1000 steps with evaluation under
# --run.precision bf16 --run.compile beside a 1-thread job; an online env step's update (batch 1024, UTD 4: four
# critic steps, one actor step) 153 ms, 104 ms in bf16
# (COMMON="--run.precision bf16 --run.compile" there). Since the actor step reads the critics frozen: 76-81 ms
# against 111-147 ms before in back-to-back timings there (bf16, compiled, nothing else running), and 85-107 ms
# per online env step in background runs beside a 1-thread job, evaluations included. On a 2-core AVX-512 Xeon
# (a 1-thread job on the other core) that update took ~163 ms, ~140 ms with --run.compile. Time yours with
# `python -m benchmarks.speed --algos wsrl` before choosing. Timed again there with the other core idle (synthetic
# hopper-sized data, 20 steps after 5 warm-up, one thread): a pre-training step 128 ms in float32, 63 ms in bf16
# and 111 ms in bf16 with --run.compile (CQL then compiled its whole loss; it slowed this step on that CPU), an
# online update 67 ms in bf16 and 40 ms with --run.compile. So COMMON holds what both stages share and
# PRE_COMMON / ONLINE_COMMON what only one does, e.g. COMMON="--run.precision bf16" ONLINE_COMMON="--run.compile"
# (100k pre-training steps: ~1.8 h). On a 2-core
# Xeon with AMX, one thread, bf16, with the ensemble LayerNorm's fused per-member calls (offrl/nets.py) and
# offrl.compiling's mask fix: a pre-training step 108.7 ms eager and 61.9 ms with --run.compile (which compiles
# CQL's critic modules on the CPU), an online update 103.9 ms eager and 55.9 ms compiled (results/speed-bf16.md,
# parts "wsrl-*"), so there COMMON="--run.precision bf16 --run.compile" (100k pre-training steps: ~1.7 h).
# The defaults here (PRE_STEPS, ONLINE_STEPS, WARMUP) are a fraction of the paper's; set them for your machine (a GPU: --device cuda through COMMON). EVAL_EVERY (online
# evaluations, env steps) and DIP_WINDOW (env steps after the updates begin in which the dip is looked for) shape
# the claims table, and so do LAST_EVALS ("last" = the mean of a run's last this many evaluations; default 1, the
# last alone) and CONTEXT_DIP_WINDOW (the dips over a longer window too, as context); PRE_EVAL_EVERY is the
# pre-training's evaluation period (gradient steps). DATASET and RESULTS (a
# path without suffix) move it to other data. SEEDS (default "0 1 2") runs a subset: each seed's runs are the
# same whichever subset they were started in, so a later call with all seeds skips them. STAGE=pre stops after the
# pre-training (to pre-train one seed while another fine-tunes). DRY_RUN=1 prints the commands instead of running
# them. Resumable: rerun after an interruption.
#   JOBS=2 benchmarks/wsrl.sh [OUT_DIR]
set -euo pipefail
quoted() { printf "%q " "$@"; }  # a command line as it can be pasted back into a shell
word() {  # one word inside a --variant string, which the sweep splits like a shell: quoted only where it must be
  case $1 in *[!A-Za-z0-9_./{}:+,=@%-]*) printf "'%s'" "${1//\'/\'\\\'\'}" ;; *) printf %s "$1" ;; esac
}
out=${1:-runs-bench}
jobs=${JOBS:-2}
pre_steps=${PRE_STEPS:-20000}
online_steps=${ONLINE_STEPS:-50000}
warmup=${WARMUP:-5000}
eval_every=${EVAL_EVERY:-2500}
dip_window=${DIP_WINDOW:-5000}
last_evals=${LAST_EVALS:-1}
context_dip=${CONTEXT_DIP_WINDOW:-}
pre_eval_every=${PRE_EVAL_EVERY:-5000}
read -r -a seeds <<< "${SEEDS:-0 1 2}"
common=${COMMON:-}
pre_common=${PRE_COMMON:-}
online_common=${ONLINE_COMMON:-}
ds=${DATASET:-offrl/hopper/medium-v0}
results=${RESULTS:-results/wsrl-hopper-medium}
dry=${DRY_RUN:-0}
stage=${STAGE:-all}
case $stage in pre|all) ;; *) echo "STAGE is 'pre' or 'all', not '$stage'" >&2; exit 2 ;; esac
run() {  # run a command, or with DRY_RUN=1 print it
  if [ "$dry" = 1 ]; then echo "$(quoted "$@")"; else "$@"; fi
}
run python -m offrl.cli datasets make "$ds"
pre=(python -m benchmarks.sweep --name wsrl-pre --out-dir "$out" --datasets "$ds" --seeds "${seeds[@]}"
     --steps "$pre_steps" --jobs "$jobs" --spread-threads --common "--eval.every $pre_eval_every --eval.episodes 10 --run.checkpoint-every 500 $common${pre_common:+ $pre_common}"
     --variant "cql=cql --hidden 256 256 --num-critics 10 --critic-subsample 2 --layer-norm --actor-layer-norm --max-target-backup")
checkpoint=$(word "$out/wsrl-pre/cql/cql/$(echo "$ds" | tr '/' '-')/{seed}-sweep")
online=(python -m benchmarks.sweep --name wsrl-online --out-dir "$out" --datasets "$ds" --seeds "${seeds[@]}" --steps "$online_steps"
        --jobs "$jobs" --spread-threads
        --common "--eval.every $eval_every --eval.episodes 10 --run.checkpoint-every 1000 $common${online_common:+ $online_common}"
        --variant "wsrl=wsrl --checkpoint $checkpoint --warmup-steps $warmup"
        --variant "retain-0.5=wsrl --checkpoint $checkpoint --warmup-steps $warmup --offline-ratio 0.5"
        --variant "no-warmup=wsrl --checkpoint $checkpoint --warmup-steps 0"
        --variant "scratch=wsrl --checkpoint none --warmup-steps $warmup")
run "${pre[@]}"
[ "$stage" = pre ] && exit 0
run "${online[@]}"
run python -m benchmarks.wsrl_plot "$out/wsrl-online" --out "$results.png" \
  --title "WSRL and baselines on $ds: $pre_steps offline + $online_steps online steps, ${#seeds[@]} seed$([ ${#seeds[@]} = 1 ] || echo s)" \
  --markdown "$results-claims.md" --dip-window "$dip_window" --last-evals "$last_evals" \
  ${context_dip:+--context-dip-window "$context_dip"} \
  --command "$(quoted "${pre[@]}"); $(quoted "${online[@]}")"
run python -m benchmarks.table "$out/wsrl-online" --out "$results.md" \
  --title "Online fine-tuning on $ds after $pre_steps CQL steps: $online_steps env steps, warm-up $warmup" \
  --command "$(quoted "${pre[@]}"); $(quoted "${online[@]}")"
