"""benchmarks.speed_vs_corl without CORL: the ratio and markdown on hand-made numbers, the block estimator, the
CORL folder and commit checks, and the command line's one-line error when --corl-dir is missing."""

import types

import pytest

from benchmarks import speed_vs_corl as svc

from conftest import PYTHON, run_cli


def measurement(side, algo, threads, rnd, ms, **extra):
    return {"side": side, "algo": algo, "threads": threads, "round": rnd, "ms": ms, **extra}


def hand_made():
    ms = [  # (algo, threads, round, CORL ms, offrl ms)
        ("iql", 1, 1, 20.0, 16.0), ("iql", 1, 2, 30.0, 18.0), ("iql", 1, 3, 25.0, 30.0),
        ("bc", 1, 1, 4.0, 4.4), ("bc", 1, 2, 4.0, 4.0), ("bc", 1, 3, 5.0, 3.0),
        ("iql", 2, 1, 10.0, 9.0),
    ]
    out = []
    for algo, threads, rnd, corl, offrl in ms:
        out.append(measurement("corl", algo, threads, rnd, corl, corl_step_median_ms=corl - 1, other_cores=0.01,
                               params=100, gflop=0.5 if algo == "iql" else None))
        out.append(measurement("offrl", algo, threads, rnd, offrl, other_cores=0.2 if algo == "bc" else 0.0,
                               params=98, gflop=0.55 if algo == "iql" else 0.1))
    return out


def test_ratio_is_the_median_over_rounds_of_each_rounds_offrl_over_corl():
    rows = svc.summarize(hand_made())
    assert [(r["algo"], r["threads"]) for r in rows] == [("iql", 1), ("bc", 1), ("iql", 2)]  # threads, then ALGOS
    iql = rows[0]
    assert iql["corl_ms"] == 25.0 and iql["offrl_ms"] == 18.0  # medians of (20, 30, 25) and (16, 18, 30)
    assert iql["round_ratios"] == pytest.approx([0.8, 0.6, 1.2])
    assert iql["ratio"] == pytest.approx(0.8)  # paired per round, not 18 / 25 = 0.72 across rounds
    assert iql["corl_round_ms"] == [20.0, 30.0, 25.0] and iql["offrl_round_ms"] == [16.0, 18.0, 30.0]
    assert iql["corl_step_median_ms"] == 24.0 and iql["goal"] == 0.8
    assert iql["params"] == {"corl": 100, "offrl": 98}
    bc = rows[1]
    assert bc["ratio"] == pytest.approx(1.0) and bc["goal"] == 1.0 and bc["max_other_cores"] == 0.2  # of 1.1, 1.0, 0.6
    assert rows[2]["ratio"] == pytest.approx(0.9) and rows[2]["rounds"] == [1]


def test_a_round_with_only_one_side_is_left_out():
    rows = svc.summarize([measurement("corl", "cql", 1, 1, 100.0), measurement("offrl", "cql", 1, 1, 70.0),
                          measurement("corl", "cql", 1, 2, 500.0)])
    assert rows[0]["rounds"] == [1] and rows[0]["ratio"] == pytest.approx(0.7)


def test_markdown_states_ratio_goal_commit_command_and_hardware():
    meta = {"command": "python -m benchmarks.speed_vs_corl --corl-dir ../corl", "date": "2030-01-02",
            "corl_commit": svc.TESTED_CORL_COMMIT, "cpu": "Some CPU", "cores": 2, "rounds": 3, "warmup": 200,
            "steps": 1000, "block": 20, "data": "950,000 transitions, obs 11, act 3",
            "batch": {"iql": 256, "bc": 256}, "corl_versions": "torch 9.9", "offrl_versions": "torch 9.9"}
    text = svc.render_markdown(meta, svc.summarize(hand_made()))
    assert "`python -m benchmarks.speed_vs_corl --corl-dir ../corl`" in text and "2030-01-02" in text
    assert svc.TESTED_CORL_COMMIT in text and "Some CPU, 2 cores" in text and "torch 9.9" in text
    lines = text.splitlines()
    iql1 = next(line for line in lines if line.startswith("| IQL | 1 |"))
    assert "| 25.00 | 18.00 | **0.800** | ≤ 0.80 ✓ | 0.800, 0.600, 1.200 | 20.00, 30.00, 25.00 |" in iql1
    bc1 = next(line for line in lines if line.startswith("| BC | 1 |"))
    assert "**1.000** | ≤ 1.00 ✓" in bc1
    assert "| IQL | 256 |" in text and "`--actor deterministic`" in text and "100 / 98" in text
    # each side's counted FLOPs, and their ratio: the time ratio at equal GFLOP/s
    assert next(line for line in lines if line.startswith("| IQL | 256 |")).endswith("| 100 / 98 | 0.500 / 0.550 | 1.100 |")
    assert next(line for line in lines if line.startswith("| BC | 256 |")).endswith("| 100 / 98 | - / 0.100 | - |")
    assert "BC 1 thread(s) 0.20" in text and "disturbed" in text  # other processes' CPU above 0.15 is flagged


def test_a_compiled_table_states_offrls_warm_up_time():
    """With --compile, offrl's warm-up (mostly compiling) is a column: the median over rounds of its warmup_s."""
    measurements = hand_made()
    for m in measurements:
        if m["side"] == "offrl":
            m["warmup_s"] = {1: 30.0, 2: 50.0, 3: 40.0}[m["round"]] + (5.0 if m["algo"] == "bc" else 0.0)
    rows = svc.summarize(measurements)
    assert [r["offrl_warmup_s"] for r in rows] == [40.0, 45.0, 30.0]  # iql 1, bc 1, iql 2 (one round)
    meta = {"command": "c", "date": "d", "corl_commit": "x", "cpu": "Some CPU", "cores": 2, "rounds": 3, "warmup": 60,
            "steps": 260, "block": 20, "data": "n", "corl_versions": "v", "offrl_versions": "v", "compile": True}
    lines = svc.render_markdown(meta, rows).splitlines()
    header = next(line for line in lines if line.startswith("| algorithm | threads |"))
    assert header.endswith("| offrl warm-up s |")
    assert next(line for line in lines if line.startswith("| IQL | 1 |")).endswith("| 24.00 | 40.0 |")
    assert next(line for line in lines if line.startswith("| BC | 1 |")).endswith("| 45.0 |")
    plain = svc.render_markdown({**meta, "compile": False}, rows)
    assert "offrl warm-up s" not in plain  # the eager tables keep their columns, header and rows alike
    assert next(line for line in plain.splitlines() if line.startswith("| IQL | 1 |")).endswith("| 24.00 |")


def test_a_waited_for_childs_cpu_counts_as_the_measuring_processs_own():
    """--run.compile runs the C++ compiler in short-lived children: their CPU must not count as other processes'
    (it flagged every compiled row as disturbed). A child burning ~0.4 s of CPU, waited for, shows in this
    process's ticks, so other_cores leaves it out."""
    import os
    import subprocess
    import sys
    import time

    before = svc.read_proc_cpu()
    start = time.process_time()
    child = subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                            "while time.process_time() - t < 0.4: pass"], check=True)
    after = svc.read_proc_cpu()
    assert child.returncode == 0 and time.process_time() - start < 0.2  # this process itself only waited
    mine = after["procs"][os.getpid()][1] - before["procs"][os.getpid()][1]
    assert mine >= 0.3 * os.sysconf("SC_CLK_TCK")


def test_flops_are_counted_on_the_chosen_calls_only():
    """CORL's side counts the FLOPs of its trainer's 2nd and 3rd `train` calls (untimed warm-up): the wrapper
    counts those calls' matmuls and leaves the others alone."""
    import torch

    class Trainer:
        def train(self, rows):
            return torch.ones(rows, 4) @ torch.ones(4, 8)  # 2 * rows * 4 * 8 FLOPs

    flops, instances = [], []
    svc.count_flops_of_calls(Trainer, "train", [2, 3], flops, instances)
    trainer = Trainer()
    outputs = [trainer.train(rows) for rows in (1, 2, 3, 4)]
    assert flops == [2 * 2 * 4 * 8, 2 * 3 * 4 * 8] and instances == [trainer]
    assert [o.shape[0] for o in outputs] == [1, 2, 3, 4] and torch.equal(outputs[2], torch.full((3, 8), 4.0))


def test_block_median_is_the_median_of_block_means_in_ms():
    steps = [0.001, 0.003] * 4 + [0.010, 0.010]  # blocks of 2: 2, 2, 2, 2, 10 ms
    assert svc.block_median_ms(steps, 2) == pytest.approx(2.0)
    assert svc.block_median_ms(steps + [1.0], 2) == pytest.approx(2.0)  # a trailing partial block is dropped


def test_corl_folder_layouts_and_commit(tmp_path):
    with pytest.raises(SystemExit, match="no algorithms/offline/iql.py"):
        svc.corl_files(tmp_path, "iql")
    clone = tmp_path / "clone"
    (clone / "algorithms" / "offline").mkdir(parents=True)
    (clone / "algorithms" / "offline" / "any_percent_bc.py").write_text("")
    with pytest.raises(SystemExit, match="configs/offline/bc/hopper/medium_v2.yaml"):
        svc.corl_files(clone, "bc")
    (clone / "configs" / "offline" / "bc" / "hopper").mkdir(parents=True)
    (clone / "configs" / "offline" / "bc" / "hopper" / "medium_v2.yaml").write_text("batch_size: 256\n")
    assert svc.corl_files(clone, "bc")[0] == clone / "algorithms" / "offline" / "any_percent_bc.py"
    flat = tmp_path / "flat"
    (flat / "configs" / "offline" / "bc" / "hopper").mkdir(parents=True)
    (flat / "configs" / "offline" / "bc" / "hopper" / "medium_v2.yaml").write_text("")
    (flat / "any_percent_bc.py").write_text("")
    assert svc.corl_files(flat, "bc")[0] == flat / "any_percent_bc.py"
    assert svc.corl_commit(flat, " abc123 ") == "abc123"
    with pytest.raises(SystemExit, match="--corl-commit"):
        svc.corl_commit(flat, None)  # no COMMIT file, not a git checkout
    (flat / "COMMIT").write_text(svc.TESTED_CORL_COMMIT + "\n")
    assert svc.corl_commit(flat, None) == svc.TESTED_CORL_COMMIT


def test_missing_corl_dir_is_a_one_line_error(tmp_path):
    result = run_cli(PYTHON, "-m", "benchmarks.speed_vs_corl", "--markdown", str(tmp_path / "x.md"), check=False,
                     timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert "--corl-dir is required" in result.stderr and not (tmp_path / "x.md").exists()
    result = run_cli(PYTHON, "-m", "benchmarks.speed_vs_corl", "--corl-dir", str(tmp_path / "nowhere"), check=False,
                     timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "is not a folder" in result.stderr
    result = run_cli(PYTHON, "-m", "benchmarks.speed_vs_corl", "--corl-dir", str(tmp_path), check=False, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "no algorithms/offline/" in result.stderr
    result = run_cli(PYTHON, "-m", "benchmarks.speed_vs_corl", "--corl-dir", str(tmp_path), "--rounds", "0", check=False,
                     timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "--rounds 0 and --threads" in result.stderr
    # a --markdown whose part it cannot write is refused before the measurements, not after them
    damaged = tmp_path / "speed-vs-corl.md"
    damaged.write_text("<!-- speed-vs-corl -->\nno end marker\n")
    result = run_cli(PYTHON, "-m", "benchmarks.speed_vs_corl", "--corl-dir", str(tmp_path), "--markdown", str(damaged),
                     check=False, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "part 'speed-vs-corl' has 1" in result.stderr
    from benchmarks import speed_vs_corl

    with pytest.raises(SystemExit, match="--corl-python /nonexistent/python: cannot run it"):
        speed_vs_corl.check_corl_python("/nonexistent/python")


def test_offrl_side_is_set_to_corl_sizes():
    for algo in svc.ALGOS:
        cfg = svc.offrl_config(algo)
        assert cfg.batch_size == 256 and cfg.run.compile is False
        assert tuple(cfg.hidden) == ((256, 256, 256) if algo == "cql" else (256, 256))
    assert svc.offrl_config("iql").actor == "deterministic"
    assert svc.offrl_config("cql").n_actions == 10


def test_the_device_reaches_both_workers_and_the_table(tmp_path, monkeypatch):
    """--device cuda: both sides' worker processes get it, and the table names the GPU and says how each side waits
    for it; a CPU table keeps its old wording."""
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        (tmp_path / f"{command[command.index('--worker') + 1]}.json").write_text('{"ms": 1.0}')
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(svc.subprocess, "run", fake_run)
    args = svc.parse_args(["--corl-dir", str(tmp_path), "--device", "cuda"])
    for side in ("corl", "offrl"):
        svc.measure(side, args, "iql", 1, tmp_path / "data.npz", tmp_path, side)
    assert [c[c.index("--device") + 1] for c in commands] == ["cuda", "cuda"]
    assert svc.parse_args(["--corl-dir", str(tmp_path)]).device == "cpu"

    meta = {"command": "c", "date": "d", "corl_commit": "x", "cpu": "Some CPU", "cores": 16, "rounds": 1, "warmup": 6,
            "steps": 20, "block": 20, "data": "n", "corl_versions": "v", "offrl_versions": "v"}
    rows = svc.summarize(hand_made())
    gpu = svc.render_markdown({**meta, "device": "cuda", "gpu": "Some GPU"}, rows)
    assert gpu.splitlines()[0].endswith("(Some GPU, host CPU Some CPU, 16 cores)")
    assert "(only `device=cuda`)" in gpu and "`.item()` every step" in gpu and "CUDA graph" in gpu
    cpu = svc.render_markdown(meta, rows)
    assert cpu.splitlines()[0].endswith("(Some CPU, 16 cores)")
    assert "(only `device=cpu`)" in cpu and ".item()" not in cpu
