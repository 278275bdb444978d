"""tests/forkserver.py: a forked command behaves as the same command in a fresh subprocess."""

import os
import signal
import subprocess
import sys
import time

import pytest

import forkserver

pytestmark = pytest.mark.skipif(os.environ.get("OFFRL_TEST_SUBPROCESS") == "1", reason="the suite runs no fork server")

SCRIPT = """
import atexit, os, sys, threading, time
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
print(os.getcwd(), os.environ.get("FORK_TEST_VALUE"), sys.argv[1:], sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
mode = sys.argv[1]
if mode == "raise":
    raise ValueError("boom")
if mode == "exit":
    sys.exit(3)
if mode == "minus2":
    sys.exit(-2)
if mode == "message":
    sys.exit("a message")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "sleep":
    time.sleep(60)
"""


def both(args, cwd, env):
    """(forked, fresh) CompletedProcesses of one command line."""
    proc = forkserver.popen(args, cwd, env)
    assert isinstance(proc, forkserver.ForkedProcess), args
    forked = subprocess.CompletedProcess(args, proc.wait(timeout=120), *proc.communicate())
    fresh = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return forked, fresh


def test_a_forked_script_exits_prints_and_fails_as_a_fresh_one(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**forkserver._server().env, "FORK_TEST_VALUE": "42"}
    for mode in ("ok", "raise", "exit", "minus2", "message", "interrupt"):
        forked, fresh = both([sys.executable, str(script), mode], tmp_path, env)
        assert forked.returncode == fresh.returncode, mode
        assert forked.stdout == fresh.stdout, mode
        assert forked.stdout.startswith(f"{tmp_path} 42 ['{mode}'] True"), forked.stdout
        assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:], (forked.stderr, fresh.stderr)
        assert ("Traceback" in forked.stderr) == ("Traceback" in fresh.stderr), mode
    assert [forkserver.run([sys.executable, str(script), m], tmp_path, env).returncode
            for m in ("ok", "exit", "minus2", "interrupt")] == [0, 3, 254, -signal.SIGINT]


def test_a_forked_module_runs_as_python_dash_m(tmp_path):
    env = forkserver._server().env
    forked, fresh = both([sys.executable, "-m", "algos.bc", "--help"], forkserver.ROOT, env)
    assert forked.returncode == fresh.returncode == 0 and forked.stdout == fresh.stdout and forked.stderr == fresh.stderr
    forked, fresh = both([sys.executable, "-m", "algos.bc", "--no-such-option"], forkserver.ROOT, env)
    assert forked.returncode == fresh.returncode == 2 and forked.stderr == fresh.stderr
    # a module the server imported runs as __main__ all the same (runpy would warn if it found it imported)
    forked, fresh = both([sys.executable, "-m", "offrl.cli", "--help"], tmp_path, env)
    assert forked.returncode == fresh.returncode == 0 and forked.stdout == fresh.stdout and forked.stderr == fresh.stderr == ""
    forked, fresh = both(["offrl", "datasets", "nonsense"], tmp_path, env)  # the console script
    assert forked.returncode == fresh.returncode != 0 and forked.stderr == fresh.stderr and forked.stderr


def test_a_forked_process_is_signalled_and_times_out_as_a_popen(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = forkserver._server().env
    proc = forkserver.popen([sys.executable, str(script), "sleep"], tmp_path, env)
    assert isinstance(proc, forkserver.ForkedProcess) and proc.pid != os.getpid()
    time.sleep(0.5)
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    started = time.monotonic()
    try:
        forkserver.run([sys.executable, str(script), "sleep"], tmp_path, env, timeout=1)
        raise AssertionError("no timeout")
    except subprocess.TimeoutExpired:
        assert time.monotonic() - started < 30


def test_what_cannot_be_forked_runs_as_a_real_subprocess(tmp_path):
    server = forkserver._server()
    other_threads = {**server.env, "OMP_NUM_THREADS": str(int(server.env.get("OMP_NUM_THREADS", "1")) + 1)}
    kinds = [(forkserver.popen([sys.executable, "-m", "algos.bc", "--help"], tmp_path, other_threads), subprocess.Popen),
             (forkserver.popen([sys.executable, "-c", "pass"], tmp_path, server.env), subprocess.Popen),
             (forkserver.popen(["bash", "-c", "true"], tmp_path, server.env), subprocess.Popen),
             (forkserver.popen([sys.executable, "-m", "algos.bc", "--help"], tmp_path, server.env), forkserver.ForkedProcess)]
    for proc, kind in kinds:  # OMP_NUM_THREADS is read by torch as it imports: the server's import would not see it
        proc.communicate(timeout=120)
        assert isinstance(proc, kind) and proc.returncode == 0, proc.args
