"""`offrl eval`: a saved run rebuilt from its checkpoint and evaluated again."""

import json

import pytest

from offrl import checkpoint as ckpt
from offrl.errors import OffrlError
from offrl.eval_run import evaluate_saved_run

from conftest import PYTHON, assert_reevaluation_reproduces, run_cli


@pytest.fixture(scope="module")
def bc_run(tiny, tmp_path_factory):
    """BC on the best 20% of tiny's episodes: the eval must use the checkpoint's state normalizer,
    not statistics of the whole dataset."""
    out = tmp_path_factory.mktemp("bc")
    run_cli(PYTHON, "-m", "algos.bc", "--steps", "300", "--frac", "0.2", "--eval.episodes", "4", "--log.wandb",
            "disabled", "--run.out-dir", str(out))
    (run_dir,) = out.glob("bc/*/*")
    return run_dir


def test_reproduces_the_runs_last_evaluation(bc_run):
    report = assert_reevaluation_reproduces(bc_run)
    assert report["algo"] == "bc" and report["step"] == 300 and report["episodes"] == 4


def test_the_command_line_with_more_episodes_and_another_seed(bc_run, tmp_path):
    result = run_cli("offrl", "eval", str(bc_run), "--episodes", "6", "--seed", "7", "--out", str(tmp_path / "e.json"))
    assert "bc on offrl/tiny-v0, step 300, 6 episodes from seed 7" in result.stdout
    assert "eval: normalized score" in result.stdout
    saved = json.loads((tmp_path / "e.json").read_text())
    assert saved["episodes"] == 6 and saved["seed"] == 7
    again = evaluate_saved_run(bc_run / "checkpoints" / "last.pt", episodes=6, seed=7)
    assert again["results"] == saved["results"]


def test_bad_input_gets_a_clear_error(bc_run, tmp_path, capsys):
    with pytest.raises(OffrlError, match="no checkpoints/last.pt"):
        evaluate_saved_run(tmp_path)
    with pytest.raises(OffrlError, match="no such run folder"):
        evaluate_saved_run(tmp_path / "missing")
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(OffrlError, match="cannot be loaded"):
        evaluate_saved_run(tmp_path / "corrupt.pt")
    state = ckpt.load(bc_run / "checkpoints" / "last.pt")
    config = json.loads(state["config"])
    config["data"]["no_such_option"] = 1
    ckpt.save(tmp_path / "other-version.pt", {**state, "config": json.dumps(config)})
    with pytest.raises(OffrlError, match=r"config.data: unknown field\(s\) no_such_option"):
        evaluate_saved_run(tmp_path / "other-version.pt")
    ckpt.save(tmp_path / "unknown-algo.pt", {**state, "algo": "nope"})
    with pytest.raises(OffrlError, match="algorithm 'nope'"):
        evaluate_saved_run(tmp_path / "unknown-algo.pt")
    with pytest.raises(OffrlError, match="not return-conditioned"):
        evaluate_saved_run(bc_run, targets=[100.0])
    result = run_cli("offrl", "eval", str(tmp_path), check=False)
    assert result.returncode == 1 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    # --out over the run's checkpoint or records, non-finite targets: refused before evaluating, nothing written
    last = bc_run / "checkpoints" / "last.pt"
    kept = last.read_bytes()
    from offrl import cli

    for args, message in ((["--out", str(last)], "a checkpoint or one of the run's records"),
                          (["--out", str(bc_run / "final.json")], "a checkpoint or one of the run's records"),
                          (["--targets", "nan"], "returns to condition on must be finite")):
        with pytest.raises(SystemExit):
            cli.main(["eval", str(bc_run), "--episodes", "1", *args])
        assert message in capsys.readouterr().err
    assert last.read_bytes() == kept
    # a file it cannot create (in /proc): refused up front where the folder is not writable to this user, else
    # (root may write any folder) found at the write, and the evaluation is not lost: its report goes to stdout
    with pytest.raises(SystemExit):
        cli.main(["eval", str(bc_run), "--episodes", "1", "--out", "/proc/offrl-eval.json"])
    out, err = capsys.readouterr()
    assert "--out /proc/offrl-eval.json: cannot write" in err, err
    if "the report is on stdout" in err:
        assert json.loads(out)["episodes"] == 1
    else:
        assert "cannot write there" in err and not out


def test_return_conditioned_policies_are_named_by_target_once_each():
    from offrl.eval_run import target_policies

    assert target_policies([300, 100.0, 300], lambda t: ("actor", t)) == {"eval": ("actor", 300.0),
                                                                       "eval_target_100": ("actor", 100.0)}
