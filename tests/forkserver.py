"""Command lines for the tests, forked from a Python that has already imported torch.

Most of the suite runs offrl as a user would, `python -m algos.bc ...` or `offrl ...`, in a process of its own;
each such process spends about 3 s of CPU importing torch before its first line runs, which over the suite's
few hundred commands was a third of its time on 2 cores. Here one server process per test process imports
torch and the libraries offrl builds on (never offrl's algorithm modules, which run as `__main__` as `python -m`
runs them), then forks a child per command. The child is still a process of its own (its own pid, exit code,
signals, working directory, environment, stdout and stderr), starts from the server's freshly imported state
(not from the test's), and exits as the interpreter does (non-daemon threads joined, atexit callbacks run,
output flushed) but without tearing down the imported modules.

What differs from a fresh interpreter: the libraries above are imported before the command's environment is
set, so a command whose environment differs from the server's in a variable read at import time (threads,
PYTHON*, TORCH*, CUDA*, ...) runs as a real subprocess instead; so does anything other than `python -m MODULE`,
`python SCRIPT.py` and `offrl`, and whatever a test asks to run `fresh`. The children of one server share its
string-hash seed (a fresh interpreter draws its own), so a test comparing two processes for determinism that
set or dict-of-str order could break runs one side fresh. OFFRL_TEST_SUBPROCESS=1 runs every command as a
real subprocess (the suite as it was, slower).

    python tests/forkserver.py        # the server: JSON lines in on stdin, out on stdout (started by the tests)
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# read by libraries as they import (thread pools, allocators, paths): a command whose environment changes one
# of these from the server's runs as a real subprocess
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "OPENBLAS", "GOTO", "NUMEXPR", "TORCH", "PYTORCH", "CUDA", "NVIDIA",
                        "ATEN_", "DNNL_", "ONEDNN_", "PYTHON", "LD_", "MUJOCO", "MALLOC", "HF_",
                        "CXX", "INDUCTOR", "AOT_INDUCTOR", "CI")  # torch._inductor.config, imported with torch._dynamo
INTERRUPTED = object()  # a child's uncaught KeyboardInterrupt: it dies by SIGINT after its exit, as Python does
# torch._dynamo: torch imports it at a process's first backward pass (~1.5 s of CPU in every training command)
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "torch._dynamo", "gymnasium", "gymnasium.envs.mujoco",
           "mujoco", "h5py", "minari", "minari.dataset._storages.hdf5_storage", "tyro", "offrl.config", "offrl.nets",
           "offrl.data", "offrl.data.suite", "offrl.checkpoint", "offrl.run", "offrl.multiseed", "offrl.cli")


# ---------------------------------------------------------------- the server


def _child(request: dict, protocol_fds: tuple[int, int]) -> None:
    """Become the command: never returns (exits with the command's exit code)."""
    import traceback

    try:
        code = _command(request, protocol_fds)
    except BaseException:  # noqa: BLE001 - the setup failed (a missing cwd, an early signal): never back into serve()
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)
    _exit(code)


def _command(request: dict, protocol_fds: tuple[int, int]):
    import random
    import runpy
    import traceback

    for fd in protocol_fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        opened = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin until it exits
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh interpreter seeds these from the OS, not from its parent
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    kind, target, args = request["kind"], request["target"], request["args"]
    try:
        if kind == "module":  # python -m MODULE: the working directory first on sys.path
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()
            sys.modules.pop(target, None)  # preloaded or not, it runs as __main__ only, as in a fresh process
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "script":  # python SCRIPT: the script's folder first on sys.path
            sys.argv = [target, *args]
            sys.path[0] = str(Path(target).resolve().parent)
            runpy.run_path(target, run_name="__main__")
        else:  # a console script: what its generated wrapper does, its folder first on sys.path
            from importlib.metadata import entry_points

            (entry,) = [e for e in entry_points(group="console_scripts") if e.name == target]
            sys.argv = [request["argv0"], *args]
            sys.path[0] = os.path.dirname(request["argv0"])
            sys.exit(entry.load()())
    except SystemExit as stop:
        if stop.code is None:
            return 0
        if isinstance(stop.code, int):
            return stop.code
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return INTERRUPTED
    except BaseException:  # noqa: BLE001 - an uncaught exception: the traceback and exit 1, as Python does
        traceback.print_exc()
        return 1
    return 0


def _exit(code) -> None:
    """The interpreter's exit up to its module teardown: wait for non-daemon threads, run the atexit
    callbacks, collect, flush (INTERRUPTED: then die by SIGINT, as after an uncaught KeyboardInterrupt). The teardown itself (deallocating every imported object, ~0.5 s on 2 cores)
    is skipped; all it would add is the finalizers of objects a module still holds at exit."""
    import atexit
    import gc
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        gc.collect()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed or broken stream: nothing more to write
                pass
        if code is INTERRUPTED:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 1
        os._exit(code & 0xFF)


def serve() -> None:
    protocol_in, protocol_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # what the imports print goes nowhere, not into the protocol or a command's output
    os.dup2(null, 2)
    os.close(null)
    import importlib
    import traceback

    def send(message: dict) -> None:
        os.write(protocol_out, (json.dumps(message) + "\n").encode())

    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - told to the tests, whose stderr this process's is not
        send({"error": traceback.format_exc()})
        return
    import gc

    # the imported objects out of the collector's sight: a child's collections, and its exit's, skip them
    # (an exit otherwise spends ~1 s collecting torch's objects), and its pages stay shared with the server
    gc.freeze()

    send({"ready": os.getpid()})
    pending, children = b"", {}  # pid -> request id
    while True:
        readable, _, _ = select.select([protocol_in], [], [], 0.02 if children else None)
        if readable:
            data = os.read(protocol_in, 1 << 16)
            if not data:
                return  # the tests are done
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, (protocol_in, protocol_out))
                children[pid] = request["id"]
                send({"id": request["id"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                send({"id": children.pop(pid), "code": os.waitstatus_to_exitcode(status)})


# ---------------------------------------------------------------- the tests' side


_BASE_ENVIRONMENT: dict | None = None


def snapshot_environment() -> None:
    """The environment servers start from: conftest's, taken before any test changes os.environ (a server
    started during a test that monkeypatched PYTHONPATH or a thread count would refuse every later command)."""
    global _BASE_ENVIRONMENT
    _BASE_ENVIRONMENT = dict(os.environ)


class _Server:
    def __init__(self):
        base = _BASE_ENVIRONMENT if _BASE_ENVIRONMENT is not None else dict(os.environ)
        env = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))}
        self.env = env
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=ROOT, env=env)
        self.buffer, self.codes, self.pids, self.next_id = b"", {}, {}, 0
        deadline = time.monotonic() + 300
        while True:
            message = self._read(deadline)
            if "ready" in message:
                break
            if "error" in message:
                raise RuntimeError(f"the test fork server could not import its libraries:\n{message['error']}")
            if not message:
                self.proc.kill()
                raise TimeoutError("the test fork server did not start in 300 s")

    def _read(self, deadline: float | None) -> dict:
        while b"\n" not in self.buffer:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                return {}
            data = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not data:
                raise RuntimeError(f"the test fork server exited ({self.proc.wait()})")
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json.loads(line)
        if "code" in message:  # by request id: a pid comes back once its process is gone
            self.codes[message["id"]] = message["code"]
        elif "pid" in message:
            self.pids[message["id"]] = message["pid"]
        return message

    def fits(self, env: dict) -> bool:
        def relevant(e):
            return {k: v for k, v in e.items() if k.startswith(IMPORT_TIME_PREFIXES)}
        return self.proc.poll() is None and relevant(env) == relevant(self.env)

    def start(self, request: dict) -> tuple[int, int]:
        """(request id, pid) of a new child."""
        self.next_id += 1
        request["id"] = self.next_id
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        while self.next_id not in self.pids:
            self._read(None)
        return self.next_id, self.pids.pop(self.next_id)

    def returncode(self, request_id: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while request_id not in self.codes:
            if not self._read(deadline) and deadline is not None and time.monotonic() >= deadline:
                return None
        return self.codes.pop(request_id)


_SERVER: _Server | None = None


def _server() -> _Server:
    global _SERVER
    if _SERVER is None or _SERVER.proc.poll() is not None:
        _SERVER = _Server()
    return _SERVER


class ForkedProcess:
    """The part of subprocess.Popen the tests use (pid, poll, wait, communicate, send_signal, kill,
    returncode), for a command forked by the server; its output is read when it has exited."""

    def __init__(self, server: _Server, args: list[str], request: dict, text: bool):
        import weakref

        self.args, self._server, self._text = args, server, text
        self._folder = tempfile.mkdtemp(prefix="offrl-fork-")
        weakref.finalize(self, shutil.rmtree, self._folder, True)  # also where communicate() is never called
        request["stdout"], request["stderr"] = (os.path.join(self._folder, name) for name in ("out", "err"))
        for name in ("out", "err"):
            Path(self._folder, name).touch()
        self._id, self.pid = server.start(request)
        self.returncode: int | None = None
        self._output = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode(self._id, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.returncode(self._id, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None):
        self.wait(timeout)
        if self._output is None:
            import io

            out, err = (Path(self._folder, name).read_bytes() for name in ("out", "err"))
            shutil.rmtree(self._folder, ignore_errors=True)
            if self._text:  # as Popen(text=True) reads: the locale's encoding, universal newlines
                out, err = (io.TextIOWrapper(io.BytesIO(data)).read() for data in (out, err))
            self._output = (out, err)
        return self._output

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _request(args: list[str], cwd, env: dict) -> dict | None:
    """The server's request for a command line, or None where it must run as a real subprocess."""
    if os.environ.get("OFFRL_TEST_SUBPROCESS") == "1" or not args:
        return None
    base = {"cwd": str(cwd), "env": env}
    if args[0] == sys.executable and len(args) >= 2:
        if args[1] == "-m" and len(args) >= 3:
            return {**base, "kind": "module", "target": args[2], "args": args[3:]}
        if args[1].endswith(".py") and not args[1].startswith("-"):
            return {**base, "kind": "script", "target": args[1], "args": args[2:]}
        return None
    if args[0] == "offrl":
        executable = shutil.which("offrl", path=env.get("PATH"))
        return {**base, "kind": "console", "target": "offrl", "argv0": executable, "args": args[1:]} if executable else None
    return None


def popen(args: list[str], cwd, env: dict, text: bool = True, fresh: bool = False):
    """subprocess.Popen(args, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE, text=text), forked where it can be
    (fresh: never)."""
    args = [str(a) for a in args]
    request = None if fresh else _request(args, cwd, env)
    server = _server() if request is not None else None
    if server is None or not server.fits(env):
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text)
    return ForkedProcess(server, args, request, text)


def run(args: list[str], cwd, env: dict, timeout: float | None = None, text: bool = True,
        fresh: bool = False) -> subprocess.CompletedProcess:
    """subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=text, timeout=timeout), forked where it
    can be (fresh: never)."""
    proc = popen(args, cwd, env, text, fresh)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


if __name__ == "__main__":
    serve()
