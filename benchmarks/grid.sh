#!/usr/bin/env bash
# The committed benchmark grid: BC, TD3+BC, IQL, CQL, RIQL, DT, RCSL, MOPO, MOBILE and RAVL on hopper,
# halfcheetah and walker2d x medium, medium-replay and medium-expert (the offrl suite, made first), 3 seeds,
# one table with JSON and plots in results/grid/. Resumable: rerun the same command after an interruption;
# finished runs are skipped, interrupted ones continue from their last checkpoint, a killed dynamics-model
# training from its last epoch. The table regenerates byte-for-byte from the run folders.
#
#   JOBS=2 benchmarks/grid.sh [OUT_DIR]                  # everything (default OUT_DIR results/grid/runs)
#   ONLY="bc iql" DATASETS="offrl/hopper/medium-v0" benchmarks/grid.sh   # a slice, e.g. for one session
#   DRY_RUN=1 benchmarks/grid.sh                         # print the commands, run nothing
#   STATUS=1 benchmarks/grid.sh [OUT_DIR]                # how far it got: each dataset (made here? the reference's
#                                  bytes?), each dynamics model's epochs, runs by state, steps and core-hours left
#                                  (give it the grid's own BF16, budgets and MODEL_*: BF16 names the variant
#                                  folders, the budgets say which runs are finished, MODEL_EPOCHS/PRECISION/COMPILE
#                                  which cached models are the grid's)
#   OTHER_DATA=1 ...                                     # run on datasets this machine made with other bytes than
#                                                        # the committed reference (refused otherwise)
#
# Budget classes, one benchmarks.sweep each, sized for a 2-core CPU with AVX-512 (2 one-thread runs at a
# time, --spread-threads at each sweep's tail) to finish in about 3 days. ms/update at 1 thread in fp32 from
# results/speed.md ("Update speed"); MOPO/MOBILE/RAVL are not in it, so their figures are the AVX2 EPYC's
# (results/speed.md part "updates-epyc-avx2", its training runs paused; a 50k-state rollout round every 1000
# steps adds ~25 ms a step, benchmarks/model_based.sh), an upper bound here. Each class: ms x steps x 9 datasets x 3 seeds x 1.10 (evaluations, logging, checkpoints: the
# goal of `python -m benchmarks.speed --end-to-end`) / 2 jobs:
#
#   sweep          algorithms: ms/update at 1 thread          steps   core-hours (sum ms)   wall hours
#   grid-fast      bc 1.36, td3_bc 5.37, iql 7.40,           100000   40.3 (48.79)          20.1
#                  riql 14.68, rcsl 19.98 (at most: RCSL
#                  stops early on its hold-out loss)
#   grid-slow      cql 200.89, dt 197.65                      10000   32.9 (398.54)         16.4
#   grid-mopo      mopo 17 + 25 (AVX2)                        20000    6.9 (42)              3.5
#   grid-mb-slow   mobile 135 + 25, ravl 161 + 25 (AVX2)       3000    8.6 (346)             4.3
#   models         9 dynamics ensembles (one per dataset, seed 0, shared by MOPO/MOBILE/RAVL and their
#                  seeds), at most MODEL_EPOCHS = 50 epochs of ~N/256 steps (9.3M rows in all: 36.4k steps
#                  an epoch) at ~19 ms a step (1.4 GFLOP at ~75 GFLOP/s; an estimate, not measured:
#                  `python -m benchmarks.speed --algos dynamics --threads 1`):    9.6                    4.8
#   datasets       the 9, and the 3 expert ones medium-expert is made from (results/datasets.md)      0.5
#   total          ~50 h of wall time; the rest of the 3 days is margin for the estimated figures above.
#
# The papers train 1M steps (DT 100k, MOPO/MOBILE/RAVL 3M); these budgets are far below, and the table says
# which each row had. The shared dynamics models all train to early stopping within MODEL_EPOCHS: MOBILE's own
# walker2d-medium cap of 30 epochs (its official config) and RAVL's at-least-350 do not apply here, and MOBILE's
# actor learning rate decays to 0 over its 3k steps (its cosine spans --steps). DT gets a 1k-step learning-rate warm-up (its default 10k would fill its budget), as in
# benchmarks/return_conditioned.sh. Every run evaluates 10 episodes (DT at two targets), 10 times per run (MOBILE and RAVL 6).
# Model-based checkpoints hold the model buffer (up to 50k x 5 x 5 rows): about 20 GB for all their run folders.
#
# Precision: fp32 by default; the figures above are float32 updates (measured on an AMD EPYC with AVX512-BF16 the
# same day as results/speed-bf16.md's first part). A CPU without native bfloat16 (no AVX512-BF16 or AMX) emulates
# bf16 matmuls, far slower. On a CPU that has it, BF16="cql dt" runs CQL and DT
# (2.8x and 2.3x faster updates on an AMD EPYC with AVX512-BF16, results/speed-bf16.md) under
# --run.precision bf16, as variants cql-bf16 and dt-bf16 in their own run folders (a run cannot change
# precision when resumed, so keep a grid on machines of one kind); the table's precision column says which.
# BF16 may name MOPO, MOBILE and RAVL as well: their updates run under bf16 (MOBILE's Bellman penalty passes the
# dynamics model inside the update), their rollouts stay fp32, and MODEL_PRECISION says how the dynamics models
# train. The hopper medium-replay model's error against the simulator under bf16 autocast is its fp32 error
# within 1% (observations) and 5.3% (rewards; results/model-error-hopper-mr-grid-*).
# Measured again two days later on an AMD EPYC (results/speed.md part "updates-epyc"), the fp32 updates were slower
# than the figures above at one thread (ms: BC 2.7 against 1.4, TD3+BC 8.3 against 5.4, IQL 12.1 against 7.4, CQL
# 225 against 201; a 100k-step BC run took 4.5 min), so the fast class may take 1.5-2x its hours in fp32. Under bf16 it is the other
# way: from results/speed-bf16.md's one-thread bf16 figures there (ms: BC 0.93, TD3+BC 3.36, IQL 4.50, RIQL
# 7.47, RCSL 7.34, CQL 71.5, DT 87.1), BF16="bc td3_bc iql riql rcsl cql dt" makes the fast class about 19.5
# core-hours and the slow one about 13 (same formula as the table above).
#
# The model-based classes on that AMD EPYC, fp32, measured after every MLP's CPU row blocks (results/speed.md
# part "model-based-epyc", one thread; a rollout round of 5 steps every 1000 at 1.45 s a step adds ~7.2 ms a
# step): MOPO 11.9 + 7.2 ms, MOBILE 84.9 + 7.2, RAVL 137.3 + 7.2, so grid-mopo about 3.2 core-hours and
# grid-mb-slow about 5.9 by the table's formula; the dynamics step timed 23.4 ms there (synthetic data), so
# the 9 models take at most about 11.8 core-hours at 50 epochs (early stopping ends most sooner). Measured in
# a real training there, the hopper medium-replay model (120k rows, 50 epochs: the cap) took 869 s in fp32
# (seed 1) and 597 s with MODEL_PRECISION=bf16 (seed 0), each beside the same two 1-thread runs: scaled to the
# 9.3M rows, at most ~18.7 core-hours in fp32 and ~12.9 in bf16. The bf16-trained model's holdout error and
# its errors against the simulator at k = 1 and 10 differ from the fp32 seed-0 model's by less than the fp32
# seeds 0 and 1 differ from each other (results/model-error-hopper-mr-grid-*; results/README).
#
# The grid's own command (results/grid/grid.md's caption) runs the model-based class in fp32: its BF16 names none
# of MOPO, MOBILE and RAVL and it sets no MODEL_PRECISION, so that every CPU, native bf16 or not, runs those runs
# and trains their dynamics models at its fp32 speed and with fp32 numerics (no model-based run had started under
# bf16). Its first model-based runs, on the three medium-replay datasets, ran on a 2-core AMD EPYC with AVX2 and
# no AVX-512, where bf16 is emulated (speed.py's bf16 timing of one DT and one CQL update did not finish in ten
# minutes; fp32 at one thread, beside a dataset being made for most of it: DT 429 ms, CQL 278 ms an update,
# `python -m benchmarks.speed --algos dt cql --threads 1 --blocks 3 --per-block 5`). There the dynamics models
# (fp32, compiled, 50 epochs, the cap, two trainings at a time) took 1236 s (hopper, 120k rows), 1564 s (walker2d, 150k) and 471 s
# (halfcheetah, 50k), and fp32 updates at one thread beside a dataset being made measured MOPO 14.5 ms, MOBILE
# 145 ms, RAVL 229 ms and a dynamics-model step 45 ms.
#
# DT runs in fp32 as well in the grid's own command (its BF16 leaves dt out, so its runs are the variant dt): of
# the four kinds of 2-core CPU the grid has run on, two emulate bf16 (the AVX2 EPYC above, a Xeon with AVX-512
# but neither AVX512-BF16 nor AMX), and there a DT update took 734 ms under bf16 against 293 ms in fp32 and 242
# compiled (that Xeon, one thread, the other core's runs paused: `python -m benchmarks.speed --algos dt --threads 1
# --blocks 3 --per-block 5 --warmup 5`, with `--precision bf16` or `--compile`). In fp32 any of them runs DT, at
# roughly 2400 s of updates per 10k-step run there. The grid's first DT runs, hopper medium-replay's three, ran
# under bf16 (BF16 named dt then) on the Xeon with AMX; their folders stay and the table shows them as the row
# dt-bf16 beside dt's fp32 ones. CQL keeps bf16: eight of its nine datasets had run under it.
#
# Fine-tuning (WSRL) is not in the grid: it needs its own CQL pre-training (10 LayerNorm critics; 63 ms a step
# in bf16 on one thread of a 2-core AMD EPYC with the other core idle, 80 ms beside a second such run; 111 ms
# with --run.compile as CQL compiled it then; on a 2-core Xeon with AMX now 108.7 eager, 61.9 compiled) and
# 0.085-0.11 s per online env step once updates start, evaluations included (benchmarks/wsrl.sh, since the actor
# step reads the critics frozen): about 22 core-hours for even 10k + 10k steps on the 27 dataset-seed pairs (four
# online variants each); benchmarks/wsrl.sh runs it on one dataset.
#
# Run folders: by default in the repository, results/grid/runs/<sweep>/<variant>/<algo>/<dataset>/<seed>-sweep,
# where .gitignore keeps out their checkpoints, locks and logs, so a finished run's record (config.json,
# dataset.json, environment.json, metrics.jsonl, final.json: 20-40 KB) can be committed and the table
# regenerates from a clean checkout. Commit the finished ones as they land (a run folder with a final.json),
# e.g. `git add $(dirname $(git ls-files -o --exclude-standard 'results/grid/runs/*final.json'))`, together with
# the table made from the committed folders (step 4's command, which DRY_RUN=1 prints; run at the end of every
# slice; tests/test_benchmarks.py checks that the committed table is what the committed folders give): a
# machine that goes away takes only its unfinished runs' checkpoints with it, and the next one skips every
# committed run. Commit a run that a NaN/inf stopped too (its folder has a diverged.json and no final.json;
# `git ls-files -o --exclude-standard 'results/grid/runs/*diverged.json'`): the table lists it and counts it in
# its row's seeds instead of showing one seed fewer without a word.
#
# Compiling: COMPILE="cql" adds --run.compile to CQL's runs (bc, td3_bc, iql, riql, cql and dt compile their
# updates; the label stays: compiling changes float rounding, not the algorithm, and a run may be resumed with
# or without it). One thread of a 2-core Xeon with AMX, bf16 (results/speed-bf16.md, parts slow-class-xeon and
# slow-class-xeon-compiled): CQL 84.3 ms an update eager, 59.5 compiled; DT 128.2 and 110.6 (once
# offrl.nets.Dropout's random words became an op torch.compile keeps in its graph), so COMPILE="cql dt" there.
# Since Dropout draws 32 bits per element (results/speed-bf16.md parts dt-xeon-32bit-dropout*, a quieter hour):
# DT 105.4 eager, 74.6 compiled (compiled with the 16-bit draws, the same hour: 88).
# The caption's command names COMPILE when it is set.
#
# Environment: JOBS (2), ONLY (algorithms, default all ten), DATASETS (ids, default the nine), BF16 (algorithms
# under bf16, default none), COMPILE (algorithms with --run.compile, default none), FAST_STEPS, SLOW_STEPS,
# MOPO_STEPS, MB_SLOW_STEPS, MODEL_EPOCHS (the budgets above), MODEL_PRECISION (fp32 or bf16: how the dynamics
# models train, and so which cached model the runs use), MODEL_COMPILE=1 (--model.compile: the models' training
# loss compiled; on one thread of the 2-core Xeon with AMX, bf16, a training step took 7.69 ms against 10.12
# eager, results/speed.md parts dynamics-xeon-amx-bf16*, after ~15 s of compiling; like MODEL_PRECISION it names
# which cached model the runs use), DRY_RUN=1 (print the commands instead of running
# them), STATUS=1 (each dataset's dynamics model, `world_models.train --status`: trained, or its epochs done and
# whether it is training now; per sweep, `benchmarks.sweep --status`: finished, running, diverged, interrupted
# and unstarted runs, steps and core-hours left; runs nothing).
#
# The model-based runs start once every dynamics model their DATASETS need is trained: with one model left (hours
# for a 1M-row dataset on one thread), the other JOBS slots idle. Two invocations with JOBS=1 keep both cores
# busy instead, one over the datasets whose models are trained, the other over the rest (as the grid's medium
# runs were made):
#   ONLY="mopo mobile ravl" JOBS=1 DATASETS="offrl/hopper/medium-v0 offrl/walker2d/medium-v0" benchmarks/grid.sh ...
#   ONLY="mopo mobile ravl" JOBS=1 DATASETS="offrl/halfcheetah/medium-v0" benchmarks/grid.sh ...
# (each with the caption's budgets, BF16, COMPILE and MODEL_* in front). Their runs land in the same folders; a
# run is never run twice (the sweeps' per-run locks).

# The body is one { } block: bash reads all of it before running any, so the script may be edited (a git pull)
# while a grid runs for hours without the running copy reading the new text at its old offsets.
{
set -euo pipefail
# a script's background jobs ignore SIGINT (bash starts them so): stop the model trainings with it on Ctrl-C
trap 'pids=$(jobs -rp); [ -z "$pids" ] || kill -TERM $pids 2>/dev/null || true; exit 130' INT
quoted() { printf "%q " "$@"; }  # a command line as it can be pasted back into a shell
out=${1:-results/grid/runs}
jobs=${JOBS:-2}
fast_steps=${FAST_STEPS:-100000}
slow_steps=${SLOW_STEPS:-10000}
mopo_steps=${MOPO_STEPS:-20000}
mb_slow_steps=${MB_SLOW_STEPS:-3000}
model_epochs=${MODEL_EPOCHS:-50}
model_precision=${MODEL_PRECISION:-fp32}
case $model_precision in fp32 | bf16) ;; *) echo "MODEL_PRECISION must be fp32 or bf16, got '$model_precision'" >&2; exit 2 ;; esac
model_compile=${MODEL_COMPILE:-0}
case $model_compile in 0 | 1) ;; *) echo "MODEL_COMPILE must be 0 or 1, got '$model_compile'" >&2; exit 2 ;; esac
bf16=${BF16:-}
compile=${COMPILE:-}
dry=${DRY_RUN:-0}
status=${STATUS:-0}
all_algos="bc td3_bc iql cql riql dt rcsl mopo mobile ravl"
only=${ONLY:-$all_algos}
all_datasets=()
for env in hopper halfcheetah walker2d; do
  for level in medium medium-replay medium-expert; do all_datasets+=("offrl/$env/$level-v0"); done
done
read -r -a datasets <<< "${DATASETS:-${all_datasets[*]}}"
for algo in $only $bf16 $compile; do
  case " $all_algos " in *" $algo "*) ;; *) echo "unknown algorithm '$algo' (known: $all_algos)" >&2; exit 2 ;; esac
done
if [ -n "$compile" ]; then  # the algorithms whose update reads --run.compile, as offrl.run lists them
  compiling=$(python -c "from offrl.run import COMPILING_ALGORITHMS; print(' '.join(COMPILING_ALGORITHMS))")
  for algo in $compile; do
    case " $compiling " in *" $algo "*) ;; *)
      echo "COMPILE: $algo does not compile its update ($compiling do)" >&2; exit 2 ;; esac
  done
fi
wanted() { case " $only " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
run() {  # run a command, or with DRY_RUN=1 print it
  if [ "$dry" = 1 ]; then echo "$(quoted "$@")"; else "$@"; fi
}
if [ "$dry" != 1 ] && ! grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
  slow_here=""  # the BF16 algorithms this invocation runs (ONLY may leave some out)
  for algo in $bf16; do if wanted "$algo"; then slow_here+="${slow_here:+ }$algo"; fi; done
  [ -z "$slow_here" ] || echo "warning: BF16 names $slow_here on a CPU without native bfloat16: those runs will be far slower than in fp32" >&2
  if { wanted mopo || wanted mobile || wanted ravl; } && [ "$model_precision" != fp32 ]; then
    echo "warning: MODEL_PRECISION=bf16 on a CPU without native bfloat16: the dynamics models will train far slower than in fp32" >&2
  fi
fi

# A variant per selected algorithm: label=algo [options]; under BF16 the label gets -bf16.
variants() {  # CLASS_ALGOS... -> --variant arguments on stdout, one per line
  local algo label extra
  for algo in "$@"; do
    wanted "$algo" || continue
    label=$algo extra=""
    case $algo in
      dt) extra="--warmup-steps 1000" ;;
      mopo | mobile | ravl) extra="--model-seed 0 --model.max-epochs $model_epochs"
        [ "$model_precision" = fp32 ] || extra+=" --model.precision $model_precision"
        [ "$model_compile" = 0 ] || extra+=" --model.compile" ;;
    esac
    case " $bf16 " in *" $algo "*) label="$algo-bf16" extra="${extra:+$extra }--run.precision bf16" ;; esac
    case " $compile " in *" $algo "*) extra="${extra:+$extra }--run.compile" ;; esac
    printf '%s\n' --variant "$label=$algo${extra:+ $extra}"
  done
}
sweep() {  # NAME STEPS COMMON CLASS_ALGOS... : one benchmarks.sweep over the selected algorithms of a class
  local name=$1 steps=$2 common=$3
  shift 3
  local chosen=()
  mapfile -t chosen < <(variants "$@")
  [ ${#chosen[@]} -gt 0 ] || return 0
  if [ "$status" = 1 ]; then  # benchmarks.sweep --status: reads the run folders, runs nothing
    echo "$name ($steps steps):"
    python -m benchmarks.sweep --name "$name" --out-dir "$out" --datasets "${datasets[@]}" --seeds 0 1 2 \
      --steps "$steps" "${chosen[@]}" --status
    return 0
  fi
  # a failed run (its log says why; the sweep exits 3) does not hold back the other classes or the table: counted,
  # reported at the end. A sweep that could not start (bad options, finished runs made with other ones) stops here.
  local rc=0
  run python -m benchmarks.sweep --name "$name" --out-dir "$out" --datasets "${datasets[@]}" --seeds 0 1 2 \
    --steps "$steps" --jobs "$jobs" --spread-threads --common "$common" "${chosen[@]}" || rc=$?
  if [ "$rc" = 3 ]; then failed_sweeps+=("$name"); elif [ "$rc" != 0 ]; then exit "$rc"; fi
}
failed_sweeps=()

# 1. datasets (each made once; a made one is skipped). One that this CPU makes with other bytes than the committed
# reference is made once more under MKL_CBWR=SSE4_2 (MKL's SSE4.2 kernels), which gives some of them the reference
# bytes on Intel CPUs (README, "The offrl dataset suite"); the runs then train under MKL's default kernels.
if [ "$status" != 1 ] && [ "$dry" = 1 ]; then
  for ds in "${datasets[@]}"; do run python -m offrl.cli datasets make "$ds"; done
elif [ "$status" != 1 ]; then
  mapfile -t unmade < <(python -c "import sys; from offrl.data import suite
print(*[d for d in sys.argv[1:] if not suite.exists(d)], sep='\n')" "${datasets[@]}")
  for ds in "${datasets[@]}"; do
    python -m offrl.cli datasets make "$ds" || exit 1
    case " ${unmade[*]} " in *" $ds "*) ;; *) continue ;; esac  # made before: as it is
    [ -z "${MKL_CBWR:-}" ] || continue
    python -c "import sys; from offrl.data import suite; sys.exit(0 if suite.differs_from_reference(sys.argv[1]) else 1)" \
      "$ds" || continue
    echo "$ds: made here with other bytes than the committed reference; making it again with MKL_CBWR=SSE4_2" >&2
    MKL_CBWR=SSE4_2 python -m offrl.cli datasets make --force "$ds" || exit 1
  done
fi
# ... and the same bytes as the committed reference: a dataset this CPU does not regenerate exactly (README,
# "The offrl dataset suite") would put runs on other data beside the reference's in one row. OTHER_DATA=1 runs
# them anyway; the table then names the data each such row trained on.
if [ "$status" != 1 ] && [ "$dry" != 1 ] && [ "${OTHER_DATA:-0}" != 1 ]; then
  python - "${datasets[@]}" <<'PY' || exit 2
import sys
from offrl.data import suite
bad = [(d, suite.differs_from_reference(d)) for d in sys.argv[1:]]
bad = [(d, sums) for d, sums in bad if sums]
for d, (local, ref) in bad:
    print(f"{d}: made here with checksum {local}, the committed reference is {ref}", file=sys.stderr)
if bad:
    print("this machine does not regenerate these datasets exactly: leave them out of DATASETS and run them where "
          "they match, or set OTHER_DATA=1 to run on these bytes (the table names them); one made before without it "
          "may match when made again with MKL_CBWR=SSE4_2 in front of `offrl datasets make --force`", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
fi

# 2. one dynamics model per dataset for MOPO/MOBILE/RAVL, JOBS at a time (cached; reused by every run)
model_options=(--seed 0 --model.max-epochs "$model_epochs" --threads 1)
[ "$model_precision" = fp32 ] || model_options+=(--model.precision "$model_precision")
[ "$model_compile" = 0 ] || model_options+=(--model.compile)
if [ "$status" = 1 ]; then  # each dataset: made here, and with the committed reference's bytes?
  echo "datasets:"
  python - "${datasets[@]}" <<'PY' || exit 2
import sys

from offrl.data import suite

for dataset in sys.argv[1:]:
    if not suite.exists(dataset):
        print(f"  {dataset}: not made yet")
    elif other := suite.differs_from_reference(dataset):
        print(f"  {dataset}: made here with other bytes than the committed reference ({other[0]}, the reference "
              f"{other[1]}): its runs are refused unless OTHER_DATA=1")
    else:
        print(f"  {dataset}: made" + (", the committed reference's bytes" if dataset in suite.reference_checksums() else ""))
PY
fi
if [ "$status" = 1 ] && { wanted mopo || wanted mobile || wanted ravl; }; then
  # world_models.train --status for each dataset, in one process (torch imported once)
  echo "dynamics models (world_models.train $(quoted "${model_options[@]}")--status):"
  python - "${model_options[@]}" -- "${datasets[@]}" <<'PY' || exit 2
import sys

import tyro

from offrl.data import load_dataset, suite
from offrl.errors import OffrlError
from world_models.train import TrainModelConfig, model_status

cut = sys.argv.index("--")
for dataset in sys.argv[cut + 1:]:
    cfg = tyro.cli(TrainModelConfig, args=["--dataset", dataset, *sys.argv[1:cut]])
    try:  # one dataset's error (a file gone, a corrupt checkpoint) leaves the others' and the sweeps' status
        made = dataset not in suite.known_ids() or suite.exists(dataset)
        status = model_status(load_dataset(dataset), cfg.model, cfg.seed) if made else "dataset not made yet"
    except OffrlError as exc:
        status = f"error: {exc}"
    print(f"  {dataset}: {status}")
PY
fi
if [ "$status" != 1 ] && { wanted mopo || wanted mobile || wanted ravl; }; then
  if [ "$dry" = 1 ]; then echo "mkdir -p $(quoted "$out/grid-models")# then these, $jobs at a time:"
  else mkdir -p "$out/grid-models"; fi
  pids=()
  for ds in "${datasets[@]}"; do
    model=(python -m world_models.train --dataset "$ds" "${model_options[@]}")
    log="$out/grid-models/${ds//\//-}.log"
    if [ "$dry" = 1 ]; then echo "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(quoted "${model[@]}")> $log 2>&1 &"; continue; fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "${model[@]}" > "$log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do  # a failed training stops the script here (its log says why)
    wait "$pid" || { echo "a dynamics model training failed; see $out/grid-models/*.log" >&2; exit 1; }
  done
fi

# 3. the sweeps, one per budget class
sweep grid-fast "$fast_steps" "--eval.every 10000 --eval.episodes 10 --run.checkpoint-every 5000" \
  bc td3_bc iql riql rcsl
sweep grid-slow "$slow_steps" "--eval.every 1000 --eval.episodes 10 --run.checkpoint-every 250" cql dt
sweep grid-mopo "$mopo_steps" "--eval.every 2000 --eval.episodes 10 --run.checkpoint-every 1000" mopo
sweep grid-mb-slow "$mb_slow_steps" "--eval.every 500 --eval.episodes 10 --run.checkpoint-every 250" mobile ravl

[ "$status" != 1 ] || exit 0
# 4. the table from every finished run of the grid (whatever slices have run so far). The caption quotes
# the budgets, not JOBS/ONLY/DATASETS, which do not change what a finished run holds, so the same run
# folders give the same bytes. It quotes this invocation's BF16/COMPILE/MODEL_* too: run every slice with the
# grid's own (a sweep refuses finished runs made with other options, except those a resume may change,
# offrl.run.RESUMABLE_CHANGES: --run.compile, threads, device, evaluation and logging settings and the like,
# which change float rounding or what is recorded, not the algorithm). Dynamics models are cached per machine
# (~/.cache/offrl/models): seeds of one row run on two machines roll out two models trained alike, each run's
# final.json naming its file and (since offrl recorded it) hash, hold-out errors and training.
canonical="FAST_STEPS=$fast_steps SLOW_STEPS=$slow_steps MOPO_STEPS=$mopo_steps MB_SLOW_STEPS=$mb_slow_steps"
canonical+=" MODEL_EPOCHS=$model_epochs"
[ "$model_precision" = fp32 ] || canonical+=" MODEL_PRECISION=$model_precision"
[ "$model_compile" = 0 ] || canonical+=" MODEL_COMPILE=1"
canonical+="${bf16:+ BF16='$bf16'}${compile:+ COMPILE='$compile'} benchmarks/grid.sh $out"
table_rc=0  # no finished run at all is an error of the table's; the failed sweeps are still named below
run python -m benchmarks.table "$out/grid-fast" "$out/grid-slow" "$out/grid-mopo" "$out/grid-mb-slow" \
  --out results/grid/grid.md --json results/grid/grid.json --plots results/grid/plots \
  --title "Offline RL grid: 10 algorithms on hopper, halfcheetah, walker2d x medium, medium-replay, medium-expert, 3 seeds, CPU budgets" \
  --command "$canonical" || table_rc=$?
if [ ${#failed_sweeps[@]} -gt 0 ]; then
  echo "runs failed in: ${failed_sweeps[*]} (see the logs beside their run folders); the table holds the finished runs" >&2
  exit 1
fi
exit "$table_rc"
}
