"""Command-line smoke tests: each algorithm trains, evaluates, logs and checkpoints as a user runs it."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, run_cli

FAST = ["--eval.episodes", "5", "--log.every", "100", "--log.wandb", "disabled"]


def run_dir_of(base, algo):
    (run_dir,) = [p for p in base.glob(f"{algo}/*/*") if p.is_dir()]
    return run_dir


def check_run_dir(run_dir):
    for name in ("config.json", "environment.json", "metrics.jsonl", "final.json", "checkpoints/last.pt"):
        assert (run_dir / name).exists(), name
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["packages"]["torch"] and env["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # --device auto
    assert "cpu_model" in env and "cpu_native_bf16" in env  # None where /proc/cpuinfo cannot be read
    return json.loads((run_dir / "final.json").read_text())


def test_td3_bc_beats_the_random_policy(tiny, tmp_path):
    result = run_cli(PYTHON, "-m", "algos.td3_bc", "--dataset", tiny, "--steps", "600", "--eval.every", "200",
                     *FAST, "--run.out-dir", str(tmp_path))
    final = check_run_dir(run_dir_of(tmp_path, "td3_bc"))
    assert "final normalized score" in result.stdout
    # 0 is the uniform-random policy's mean return (the dataset's ref_min_score)
    assert final["eval/normalized_score"] > 50, final
    rows = [json.loads(line) for line in (run_dir_of(tmp_path, "td3_bc") / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/normalized_score" in r] == [200, 400, 600]
    assert all("critic_loss" in r for r in rows if "eval/normalized_score" not in r)


def test_bf16_precision_trains(tiny, tmp_path):
    """--run.precision bf16 (autocast) learns as fp32 does on tiny, and the run records it. Small networks:
    on a CPU without native bfloat16 (AVX2 only) bf16 matmuls are emulated, about 6x slower than fp32."""
    run_cli(PYTHON, "-m", "algos.td3_bc", "--dataset", tiny, "--steps", "500", "--eval.every", "0",
            "--run.precision", "bf16", "--hidden", "64", "64", *FAST, "--run.out-dir", str(tmp_path))
    run_dir = run_dir_of(tmp_path, "td3_bc")
    assert json.loads((run_dir / "config.json").read_text())["run"]["precision"] == "bf16"
    assert check_run_dir(run_dir)["eval/normalized_score"] > 50


def test_bc_and_percent_bc(tiny, tmp_path):
    run_cli(PYTHON, "-m", "algos.bc", "--steps", "300", "--frac", "0.2", *FAST, "--run.out-dir", str(tmp_path))
    final = check_run_dir(run_dir_of(tmp_path, "bc"))
    assert final["train/kept_episodes"] == round(0.2 * 89)
    assert final["eval/normalized_score"] > 0


def test_offrl_train_and_wandb_offline(tiny, tmp_path):
    run_cli("offrl", "train", "bc", "--steps", "100", "--eval.episodes", "2", "--run.out-dir", str(tmp_path))
    run_dir = run_dir_of(tmp_path, "bc")
    check_run_dir(run_dir)
    assert list(run_dir.glob("wandb/offline-run-*")), "wandb offline run folder missing"


from offrl.cli import ALGORITHMS


def test_offrl_train_knows_every_algorithm_module():
    """`offrl train <algo>` is documented as `python -m algos.<algo>`: every algorithm file must be reachable."""
    modules = {p.stem for p in (Path(__file__).parent.parent / "algos").glob("*.py") if p.stem != "__init__"}
    assert modules == set(ALGORITHMS)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_help_documents_every_option(algo):
    import importlib

    module = importlib.import_module(f"algos.{algo}")
    text = run_cli(PYTHON, "-m", f"algos.{algo}", "--help").stdout

    def flags(cls, prefix=""):
        for f in dataclasses.fields(cls):
            name = prefix + f.name.replace("_", "-")
            if dataclasses.is_dataclass(getattr(cls(), f.name)):  # a group of options: --<name>.<option>
                yield from flags(type(getattr(cls(), f.name)), name + ".")
            else:
                yield name

    for flag in flags(module.Config):
        assert re.search(rf"--{re.escape(flag)}(?![\w.-])", text), flag  # whole: --seed is not --seeds
    assert text.count("(default:") >= len(list(flags(module.Config)))


@pytest.mark.parametrize("algo, options, says", [
    ("bc", ["--eval.episodes", "0"], "--eval.episodes 0"),  # failed at the first evaluation, after unsaved steps
    ("bc", ["--eval.seed-offset", "-101"], "--eval.seed-offset -101"),
    ("bc", ["--steps", "-5"], "--steps -5"),  # trained nothing and wrote a final.json
    ("bc", ["--batch-size", "0"], "--batch-size 0"),  # NaN losses, reported as a divergence
    ("bc", ["--seed", "-1"], "--seed -1"),
    ("bc", ["--run.threads", "-1"], "--run.threads -1"),
    ("bc", ["--device", "bogus"], "--device bogus"),
    ("bc", ["--frac", "0"], "--frac 0"),
    ("iql", ["--data.reward-scale", "nan"], "--data.reward-scale nan"),
    ("dt", ["--heads", "3", "--embed-dim", "16"], "--heads 3"),
    ("td3_bc", ["--policy-freq", "0"], "--policy-freq 0: at least 1"),  # a ZeroDivisionError mid-run
    ("iql", ["--critic-loss", "hl-gauss", "--gamma", "1"], "give --hl-v-min and --hl-v-max"),
    ("mopo", ["--rollout-length", "0"], "--rollout-length 0: at least 1"),  # ran at the default, recorded 0
    ("mbrcsl", ["--num-trajectories", "0"], "--num-trajectories 0"),  # an error only after behaviour cloning
])
def test_bad_option_values_get_one_error_line_before_a_run_folder_is_made(tiny, tmp_path, algo, options, says):
    result = run_cli(PYTHON, "-m", f"algos.{algo}", "--steps", "20", "--log.wandb", "disabled",
                     "--run.out-dir", str(tmp_path / "runs"), *options, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error:") and says in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()


def test_config_files_and_options_that_cannot_work_together(tmp_path):
    """--config with --resume continued another run than the saved one, silently (--config resets the folder's
    name); a bare --seeds trained seed 0 and recorded seeds [], which later resumes tripped on; a --config JSON
    with a value of the wrong type gave a traceback, or none (a section replaced by its defaults)."""
    from algos import bc
    from offrl.config import from_dict, to_dict
    from offrl.errors import OffrlError
    from offrl.run import parse_config

    saved = tmp_path / "run"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps(to_dict(bc.Config())))
    with pytest.raises(OffrlError, match="--config .* with --resume latest: .* give one of them"):
        parse_config(bc.Config, ["--config", str(saved), "--resume", "latest"])
    assert parse_config(bc.Config, ["--config", str(saved)]).resume is None
    named = parse_config(bc.Config, ["--config", str(saved), "--resume", "auto", "--log.name", "0-sweep"])  # a sweep's
    assert named.resume == "auto" and named.log.name == "0-sweep"
    with pytest.raises(OffrlError, match="--seeds without a seed"):
        parse_config(bc.Config, ["--seeds"])
    for given in (["--seed", "5"], ["--seed=0"]):  # ignored beside --seeds, silently
        with pytest.raises(OffrlError, match="with --seeds 0 1: --seeds names every seed the process trains"):
            parse_config(bc.Config, ["--seeds", "0", "1", *given])
    assert parse_config(bc.Config, ["--seeds", "0", "1"]).seeds == (0, 1)
    for values, says in (({"steps": "abc"}, "t.steps: 'abc'"), ({"steps": None}, "t.steps: None"),
                         ({"data": None}, "t.data: None"), ({"eval": 5}, "t.eval: 5"), ({"steps": 1.5}, "t.steps: 1.5"),
                         ({"hidden": 16}, "t.hidden: 16"), ({"data": {"normalize_states": "yes"}}, "t.data.normalize_states")):
        with pytest.raises(OffrlError, match=re.escape(says)):
            from_dict(bc.Config, values, "t")
    assert from_dict(bc.Config, {"lr": 1, "frac": 1, "hidden": [16, 16], "seeds": None}, "t").hidden == (16, 16)


ALGOS_WITH_CONFIG = ("bc", "td3_bc", "sac", "iql", "riql", "cql", "dt", "rcsl", "mopo", "mobile", "ravl", "mbrcsl", "wsrl")


@pytest.mark.parametrize("algo, options, says", [
    # each was accepted, then crashed mid-run (a division by zero, a shape or range error in torch)...
    ("iql", {"num_critics": 0}, "--num-critics 0: at least 1"), ("cql", {"critic_subsample": 0}, "--critic-subsample 0"),
    ("dt", {"dropout": 1.5}, "--dropout 1.5: a probability in [0, 1)"), ("riql", {"quantile": 1.5}, "--quantile 1.5"),
    ("riql", {"sigma": 0.0}, "--sigma 0.0: must be > 0"), ("cql", {"n_actions": 0}, "--n-actions 0"),
    ("sac", {"init_alpha": 0.0}, "--init-alpha 0.0"), ("sac", {"buffer_size": 0}, "--buffer-size 0"),
    ("td3_bc", {"hidden": (0,)}, "--hidden 0: every width at least 1"), ("dt", {"max_timestep": 0}, "--max-timestep 0"),
    ("rcsl", {"holdout_every": 0}, "--holdout-every 0"), ("rcsl", {"holdout_ratio": 1.0}, "--holdout-ratio 1.0"),
    ("mopo", {"rollout_every": 0}, "--rollout-every 0"), ("mopo", {"retain_epochs": 0}, "--retain-epochs 0"),
    ("iql", {"critic_loss": "hl-gauss", "hl_bins": 1}, "--hl-bins 1: at least 2"),
    ("iql", {"critic_loss": "hl-gauss", "hl_v_min": 5.0, "hl_v_max": -5.0}, "--hl-v-min 5.0 --hl-v-max -5.0"),
    ("mbrcsl", {"horizon": 0}, "--horizon 0"), ("mbrcsl", {"behaviour": {"time_dim": 2}}, "--behaviour.time-dim 2"),
    ("mbrcsl", {"rcsl": {"holdout_every": 0}}, "--rcsl.holdout-every 0"),
    # ... gave NaN losses that read as a divergence ...
    ("cql", {"temperature": 0.0}, "--temperature 0.0"), ("rcsl", {"rtg_scale": 0.0}, "--rtg-scale 0.0"),
    ("mobile", {"num_samples": 1}, "--num-samples 1"), ("ravl", {"num_critics": 1}, "--num-critics 1: at least 2"),
    # ... or trained silently into nothing meaningful
    ("bc", {"lr": -1.0}, "--lr -1.0: a positive learning rate"), ("sac", {"alpha_lr": 0.0}, "--alpha-lr 0.0"),
    ("td3_bc", {"gamma": 1.5}, "--gamma 1.5: a discount in [0, 1]"), ("td3_bc", {"tau": 0.0}, "--tau 0.0"),
    ("td3_bc", {"alpha": -1.0}, "--alpha -1.0"), ("td3_bc", {"noise_clip": -1.0}, "--noise-clip -1.0"),
    ("iql", {"expectile": 1.5}, "--expectile 1.5: in (0, 1)"), ("iql", {"beta": -1.0}, "--beta -1.0"),
    ("riql", {"target_clip": (100.0, -100.0)}, "--target-clip 100.0 -100.0"), ("cql", {"cql_alpha": -5.0}, "--cql-alpha"),
    ("dt", {"grad_clip": -1.0}, "--grad-clip -1.0"), ("dt", {"warmup_steps": -10}, "--warmup-steps -10"),
    ("ravl", {"eta": -1.0}, "--eta -1.0"), ("mopo", {"penalty_coef": -1.0}, "--penalty-coef -1.0"),
    ("sac", {"actor_every": -5}, "--actor-every -5"),
])
def test_option_values_out_of_range_are_named(algo, options, says):
    import importlib

    from offrl.config import option_range_problems

    config = importlib.import_module(f"algos.{algo}").Config
    sections = {k: dataclasses.replace(getattr(config(), k), **v) for k, v in options.items() if isinstance(v, dict)}
    problems = option_range_problems(config(**{**options, **sections}))
    assert len(problems) == 1 and problems[0].startswith(says), problems


def test_every_default_config_is_in_range_and_edge_values_that_mean_something_pass():
    import importlib

    from offrl.config import option_range_problems

    for algo in ALGOS_WITH_CONFIG:
        assert option_range_problems(importlib.import_module(f"algos.{algo}").Config()) == [], algo
    from algos import dt, iql, td3_bc

    # gamma 0 (myopic), tau 1 (a hard copy), beta 0 (IQL as BC), no DT warm-up: well defined
    assert option_range_problems(td3_bc.Config(gamma=0.0, tau=1.0, alpha=0.0)) == []
    assert option_range_problems(iql.Config(beta=0.0, cosine_actor_lr=False)) == []
    assert option_range_problems(dt.Config(warmup_steps=0)) == []
    assert option_range_problems(iql.Config(critic_loss="hl-gauss", gamma=1.0, hl_v_min=-1.0, hl_v_max=1.0)) == []


def test_wandb_logging_without_the_wandb_package_is_one_error_up_front(monkeypatch):
    """check_run_options runs before a Run makes its folder (test_bad_option_values_... checks that for the rest)."""
    import importlib.util

    from algos import bc
    from offrl.errors import OffrlError
    from offrl.run import check_run_options

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    cfg = bc.Config(steps=10)
    with pytest.raises(OffrlError, match="--log.wandb offline needs the wandb package"):
        check_run_options(cfg, cfg.steps)
    cfg.log.wandb = "disabled"
    check_run_options(cfg, cfg.steps)


def test_resume_takes_only_its_own_run_folder(tiny, tmp_path):
    """--resume auto with --log.name resumes that folder only (it extended another name's finished run); a
    checkpoint file outside a run folder is refused (its grandparent folder became the run folder)."""
    common = [PYTHON, "-m", "algos.bc", "--log.wandb", "disabled", "--eval.episodes", "1", "--hidden", "16", "16",
              "--run.out-dir", str(tmp_path / "runs")]
    run_cli(*common, "--steps", "30", "--log.name", "0-short")
    short = tmp_path / "runs" / "bc" / "offrl-tiny-v0" / "0-short"
    final = (short / "final.json").read_text()
    run_cli(*common, "--steps", "60", "--log.name", "0-long", "--resume", "auto")
    assert (short / "final.json").read_text() == final  # left as it finished
    assert json.loads((short.parent / "0-long" / "final.json").read_text())["steps"] == 60
    home = tmp_path / "home"
    (home / "saved").mkdir(parents=True)
    (home / "config.json").write_text("mine")
    (home / "saved" / "bc.pt").write_bytes((short / "checkpoints" / "last.pt").read_bytes())
    result = run_cli(*common, "--steps", "60", "--resume", str(home / "saved" / "bc.pt"), check=False)
    assert result.returncode != 0 and "not a checkpoint inside a run folder" in result.stderr, result.stderr
    assert sorted(p.name for p in home.iterdir()) == ["config.json", "saved"]
    assert (home / "config.json").read_text() == "mine"
    # a named folder left without a checkpoint: the run starts beside it (<name>-1), and a later resume finds that
    (short.parent / "0-crashed").mkdir()
    run_cli(*common, "--steps", "30", "--log.name", "0-crashed", "--resume", "auto")
    again = run_cli(*common, "--steps", "60", "--log.name", "0-crashed", "--resume", "auto")
    assert "0-crashed-1" in again.stdout and not (short.parent / "0-crashed-2").exists()
    assert json.loads((short.parent / "0-crashed-1" / "final.json").read_text())["steps"] == 60
    # its config.json lost: resumed from its checkpoint file as from its folder (the file was refused before)
    (short.parent / "0-crashed-1" / "config.json").unlink()
    run_cli(*common, "--steps", "90", "--resume", str(short.parent / "0-crashed-1" / "checkpoints" / "last.pt"))
    assert json.loads((short.parent / "0-crashed-1" / "final.json").read_text())["steps"] == 90
    assert (short.parent / "0-crashed-1" / "config.json").is_file()
    result = run_cli(*common, "--steps", "30", "--seeds", "0", "1", "--log.name", "both", check=False)
    assert result.returncode != 0 and "--seeds with --log.name" in result.stderr, result.stderr


def test_datasets_commands(tiny, tmp_path):
    listed = run_cli("offrl", "datasets", "list").stdout
    assert "offrl/tiny-v0" in listed and "local" in listed
    info = json.loads(run_cli("offrl", "datasets", "info", tiny, "--json").stdout)
    assert info["transitions"] == 10_000 and info["checksum"] == info["stored_checksum"]
    assert info["ref_max_score"] == 200.0 and 0 < info["normalized_return_mean"] < 100
    assert run_cli("offrl", "datasets", "validate", tiny).stdout.startswith("ok:")
    again = run_cli("offrl", "datasets", "make", tiny, "--force").stdout
    assert info["checksum"] in again  # regeneration is exact
    assert "already made" in run_cli("offrl", "datasets", "make", tiny).stdout  # kept, not regenerated
    refused = run_cli("offrl", "datasets", "make", "--env", "InvertedPendulum-v5", "--policy", "never-read.pt",
                      "--steps", "10", "--id", tiny, check=False)  # refused before the policy is even read
    assert refused.returncode == 1 and "already exists" in refused.stderr
    unknown = run_cli("offrl", "train", "nope", check=False)
    assert unknown.returncode == 2 and "unknown algorithm" in unknown.stderr


def test_more_bad_values_refused_up_front(tiny, tmp_path, capsys, monkeypatch):
    """Values that hung (a sweep with --jobs 0), cost minutes first (your own dataset's id, checked after its
    rollouts), or trained silently on nothing (a dynamics model without a hold-out to pick elites on)."""
    from benchmarks import sweep

    for jobs in ("0", "-1"):
        with pytest.raises(SystemExit):
            sweep.main(["--name", "j", "--out-dir", str(tmp_path / "s"), "--variant", "a=bc", "--datasets", tiny,
                        "--seeds", "0", "--steps", "20", "--jobs", jobs])
        assert f"--jobs {jobs} --threads 1: each at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--name", "j", "--out-dir", str(tmp_path / "s"), "--variant", "a=bc --hidden '16", "--datasets",
                    tiny, "--seeds", "0", "--steps", "20"])
    assert "--common/--variant: No closing quotation" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    lone = run_cli("offrl", "datasets", "make", "--env", "InvertedPendulum-v5", "--policy", "never-read.pt", "--steps",
                   "10", "--id", "my/lone-v0", "--ref-min-score", "0", check=False)  # one score alone was dropped
    assert lone.returncode == 1 and "give both reference scores" in lone.stderr and "Traceback" not in lone.stderr
    empty = run_cli("offrl", "datasets", "make", "--env", "InvertedPendulum-v5", "--policy", "never-read.pt", "--steps",
                    "0", "--id", "my/empty-v0", check=False)
    assert empty.returncode == 1 and "--steps 0: a dataset needs at least one transition" in empty.stderr
    for bad_id in ("noversion", "a b/c-v0", "../escape-v0"):
        result = run_cli("offrl", "datasets", "make", "--env", "InvertedPendulum-v5", "--policy", "missing.pt",
                         "--steps", "100", "--id", bad_id, check=False)
        assert result.returncode != 0 and "not a dataset id of the form" in result.stderr, result.stderr
    result = run_cli(PYTHON, "-m", "world_models.train", "--dataset", tiny, "--model.holdout-ratio", "0",
                     "--cache-dir", str(tmp_path / "models"), check=False)
    assert result.returncode != 0 and "--model.holdout-ratio 0" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
    from offrl.errors import OffrlError
    from world_models.ensemble import EnsembleConfig, check_config

    with pytest.raises(OffrlError, match="--model.max-epochs 0: at least 1"):  # elites from untrained weights
        check_config(EnsembleConfig(max_epochs=0), training=True)
    check_config(EnsembleConfig(max_epochs=1), training=True)
    # each trained into a useless model cached as trained (patience 0: no epoch; a negative batch: no step; a
    # NaN or negative learning rate) or crashed after making a cache folder (batch 0, a zero width)
    for options, says in (({"patience": 0}, "--model.patience 0"), ({"batch_size": -5}, "--model.batch-size -5"),
                          ({"lr": float("nan")}, "--model.lr nan"), ({"lr": -1.0}, "--model.lr -1.0"),
                          ({"weight_decay": (0.0, -1.0, 0.0, 0.0, 0.0)}, "--model.weight-decay 0.0 -1.0")):
        with pytest.raises(OffrlError, match=re.escape(says)):
            check_config(EnsembleConfig(**options), training=True)
        check_config(EnsembleConfig(**options))  # a saved model loads whatever its training options were
    with pytest.raises(OffrlError, match="--model.hidden 0 0 0 0: every width at least 1"):
        check_config(EnsembleConfig(hidden=(0, 0, 0, 0)))
    (tmp_path / "a-file").write_text("")
    from world_models import train as model_training

    for options, says in (({"seed": -1}, "--seed -1: neither may be negative"),
                          ({"cache_dir": str(tmp_path / "a-file")}, "is a file"),
                          ({"cache_dir": str(tmp_path / "a-file"), "status": True}, "is a file")):
        with pytest.raises(OffrlError, match=re.escape(says)):
            model_training.main(model_training.TrainModelConfig(dataset=tiny, **options))
    from offrl import cli

    # a file where the datasets folder or a run folder goes; a dataset whose metadata.json is damaged; reference
    # scores equal or not finite (checked after the rollouts)
    for argv, env, says in ((["datasets", "list"], {"MINARI_DATASETS_PATH": str(tmp_path / "a-file")}, "is a file"),
                            (["datasets", "make", "offrl/tiny-v0"], {"MINARI_DATASETS_PATH": str(tmp_path / "a-file")},
                             "is a file"),
                            (["datasets", "make", "--env", "InvertedPendulum-v5", "--policy", "never-read.pt", "--steps",
                              "10", "--id", "my/inv-v0", "--ref-min-score", "5", "--ref-max-score", "5"], {},
                             "two finite, different returns"),
                            (["datasets", "make", "--env", "InvertedPendulum-v5", "--policy", "never-read.pt", "--steps",
                              "10", "--id", "my/inv-v0", "--ref-min-score", "nan", "--ref-max-score", "1"], {},
                             "two finite, different returns")):
        with monkeypatch.context() as patched:
            for name, value in env.items():
                patched.setenv(name, value)
            with pytest.raises(SystemExit):
                cli.main(argv)
        assert says in capsys.readouterr().err
    damaged = tmp_path / "minari" / "brk" / "x-v0" / "data"
    damaged.mkdir(parents=True)
    (damaged / "metadata.json").write_text("{")
    with monkeypatch.context() as patched:
        patched.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
        with pytest.raises(SystemExit):
            cli.main(["datasets", "verify", "brk/x-v0"])
    assert "metadata.json cannot be read" in capsys.readouterr().err
    from algos import bc

    cfg = bc.Config(dataset=tiny, steps=5)
    cfg.log.wandb, cfg.run.out_dir = "disabled", str(tmp_path / "a-file")
    with pytest.raises(OffrlError, match="cannot make the run folder"):
        bc.train(cfg)


@pytest.mark.parametrize("algo, warns", [("sac", True), ("td3_bc", False)])
def test_run_compile_warns_where_the_algorithm_does_not_compile(algo, warns, tmp_path, capsys):
    """`--run.compile` is a shared option; an algorithm whose update never reads it says so instead of
    silently training uncompiled."""
    import importlib

    from offrl.run import Run

    cfg = importlib.import_module(f"algos.{algo}").Config(steps=1)
    cfg.log.wandb, cfg.run.out_dir, cfg.run.compile = "disabled", str(tmp_path), True
    run = Run(algo, cfg)
    run.logger.close()
    run._restore_signals()
    assert ("--run.compile has no effect on " + algo in capsys.readouterr().err) == warns


def test_make_all_without_gymnasium_robotics_makes_the_rest(monkeypatch, capsys):
    """The point-maze dataset needs an optional extra: without it `--all` says so and makes every other dataset
    (it stopped at the maze, the second id, before any MuJoCo one was made)."""
    import importlib.util

    from offrl import cli
    from offrl.data import suite

    made = []
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gymnasium_robotics" else find_spec(name, *a))
    monkeypatch.setattr(suite, "exists", lambda dataset_id: False)
    monkeypatch.setattr(suite, "SuiteBuilder", lambda: None)
    monkeypatch.setattr(suite, "make", lambda dataset_id, overwrite, builder: made.append(dataset_id) or
                        {"id": dataset_id, "transitions": 1, "episodes": 1, "seconds": 0.0, "checksum": "0"})
    cli.main(["datasets", "make", "--all"])
    assert made == [i for i in suite.known_ids() if i != suite.STITCH_ID] and len(made) > 2
    assert f"{suite.STITCH_ID}: skipped, it needs gymnasium-robotics" in capsys.readouterr().out


def test_a_run_starts_from_a_saved_runs_config(tiny, tmp_path):
    """--config RUN: the saved run's options as defaults (its folder name and resume dropped), the options given
    overriding them; a missing file or another algorithm's config is one line and exit 1."""
    first = tmp_path / "first"
    run_cli(PYTHON, "-m", "algos.bc", "--dataset", tiny, "--steps", "20", "--hidden", "16", "16", "--batch-size", "32",
            "--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled", "--log.name", "saved",
            "--run.out-dir", str(first))
    saved = first / "bc" / "offrl-tiny-v0" / "saved"
    second = tmp_path / "second"
    run_cli("offrl", "train", "bc", "--config", str(saved), "--seed", "1", "--steps", "30", "--run.out-dir", str(second))
    (run_dir,) = (second / "bc" / "offrl-tiny-v0").iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["hidden"] == [16, 16] and config["batch_size"] == 32 and config["eval"]["episodes"] == 2
    assert config["seed"] == 1 and config["steps"] == 30 and config["log"]["name"] is None and config["resume"] is None
    assert config["run"]["out_dir"] == str(second)  # given; without it the default, not the saved run's tree
    assert run_dir.name.startswith("1-")
    # a sweep variant may start from it too; the rerun reads the finished run's options through it and skips the run
    sweep_args = ["-m", "benchmarks.sweep", "--name", "c", "--out-dir", str(tmp_path / "sweeps"), "--variant",
                  f"c=bc --config {saved}", "--datasets", tiny, "--seeds", "2", "--steps", "20"]
    run_cli(PYTHON, *sweep_args)
    swept = json.loads((tmp_path / "sweeps" / "c" / "c" / "bc" / "offrl-tiny-v0" / "2-sweep" / "config.json").read_text())
    assert swept["hidden"] == [16, 16] and swept["seed"] == 2 and swept["log"]["name"] == "2-sweep"
    assert "1 of 1 runs already finished" in run_cli(PYTHON, *sweep_args).stdout
    missing = run_cli(PYTHON, "-m", "algos.bc", "--config", str(tmp_path / "nope"), check=False)
    assert missing.returncode == 1 and "--config" in missing.stderr and "Traceback" not in missing.stderr
    other = run_cli(PYTHON, "-m", "algos.td3_bc", "--config", str(saved / "config.json"), check=False)
    assert other.returncode == 1 and "a bc run's config, not td3_bc's" in other.stderr and "Traceback" not in other.stderr
    checkpoint = run_cli(PYTHON, "-m", "algos.bc", "--config", str(saved / "checkpoints" / "last.pt"), check=False)
    assert checkpoint.returncode == 1 and "give the run folder or its config.json" in checkpoint.stderr
    assert "Traceback" not in checkpoint.stderr
    # a folder without final.json: its place <algo>/<dataset>/<run> tells (a MOPO config would fit MOBILE's fields)
    placed = tmp_path / "elsewhere" / "bc" / "offrl-tiny-v0" / "r"
    placed.mkdir(parents=True)
    (placed / "config.json").write_text((saved / "config.json").read_text())
    by_place = run_cli(PYTHON, "-m", "algos.td3_bc", "--config", str(placed), check=False)
    assert by_place.returncode == 1 and "a bc run's config, not td3_bc's" in by_place.stderr
    # without --run.out-dir the new run goes to the default place, not into the saved run's tree (a sweep's, say)
    run_cli(PYTHON, "-m", "algos.bc", "--config", str(saved), "--steps", "5", cwd=tmp_path / "elsewhere")
    assert len(list((tmp_path / "elsewhere" / "runs" / "bc" / "offrl-tiny-v0").iterdir())) == 1
    assert len(list((first / "bc" / "offrl-tiny-v0").iterdir())) == 1
    # a copy outside any run folder: the fields tell
    (tmp_path / "loose.json").write_text((saved / "config.json").read_text())
    loose = run_cli(PYTHON, "-m", "algos.td3_bc", "--config", str(tmp_path / "loose.json"), check=False)
    assert loose.returncode == 1 and "unknown field(s) frac" in loose.stderr
