"""Atomic checkpoint writes, safe loading, clear errors."""

import io
import os

import pytest
import torch

from offrl import checkpoint as ckpt
from offrl.errors import CheckpointError


def test_round_trip(tmp_path):
    state = {"step": 3, "w": torch.arange(4.0), "nested": {"opt": [1, 2.5, "x"]}}
    ckpt.save(tmp_path / "c.pt", state)
    back = ckpt.load(tmp_path / "c.pt")
    assert back["step"] == 3 and back["nested"] == state["nested"]
    torch.testing.assert_close(back["w"], state["w"])


def test_map_location_moves_the_checkpoint_and_not_its_envelope(tmp_path):
    """The hashed byte payload is read on the CPU whatever the run's device; a CUDA run resuming failed
    here once ('can't convert cuda:0 device type tensor to numpy'). The meta device stands in for CUDA."""
    ckpt.save(tmp_path / "c.pt", {"w": torch.arange(4.0)})
    back = ckpt.load(tmp_path / "c.pt", map_location="meta")
    assert back["w"].device.type == "meta" and back["w"].shape == (4,)


def test_a_failed_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    """The file write itself fails half-way (the in-memory encoding before it succeeds): the old file stays
    whole and the temp file the write went to is removed."""
    path = tmp_path / "last.pt"
    ckpt.save(path, {"step": 1})
    real_save, seen = torch.save, []

    def save_failing_on_the_file(obj, f):
        if isinstance(f, io.BytesIO):
            return real_save(obj, f)  # _encode's in-memory pass
        seen.extend(p.name for p in tmp_path.glob(".last.pt.*.tmp"))  # the write goes to a temp file
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", save_failing_on_the_file)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(path, {"step": 2})
    monkeypatch.undo()
    assert len(seen) == 1, seen
    assert ckpt.load(path)["step"] == 1
    assert os.listdir(tmp_path) == ["last.pt"]  # no temp file left behind


def test_a_flipped_bit_fails_the_checksum(tmp_path):
    """A payload whose bytes changed after it was hashed loads as torch data but not as a checkpoint."""
    path = tmp_path / "c.pt"
    ckpt.save(path, {"w": torch.zeros(1000)})
    envelope = torch.load(path, weights_only=True)
    envelope["payload"][-100] ^= 1  # inside the tensor data, near the end of the zip
    torch.save(envelope, path)
    with pytest.raises(CheckpointError, match="do not match their SHA-256"):
        ckpt.load(path)


def test_corrupt_and_missing_checkpoints_raise_checkpoint_error(tmp_path):
    path = tmp_path / "c.pt"
    ckpt.save(path, {"step": 1, "w": torch.zeros(1000)})
    path.write_bytes(path.read_bytes()[:200])  # truncated
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        ckpt.load(path)
    with pytest.raises(CheckpointError, match="not found"):
        ckpt.load(tmp_path / "nothing.pt")


class Payload:
    """Unpickling it creates the file `marker`: proof that loading ran code from the file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("wrapped", [False, True])
def test_loading_refuses_arbitrary_objects(tmp_path, wrapped):
    """A plain torch file, or an offrl checkpoint whose payload holds the object: neither runs its code."""
    path, marker = tmp_path / "evil.pt", tmp_path / "ran"
    state = {"step": Payload(marker)}
    ckpt.save(path, state) if wrapped else torch.save(state, path)
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        ckpt.load(path)
    assert not marker.exists()
    torch.load(path if not wrapped else io.BytesIO(torch.load(path, weights_only=True)["payload"].numpy().tobytes()),
               weights_only=False)  # the control: a loader without weights_only runs it
    assert marker.exists()


def test_state_that_does_not_fit_names_the_object():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match="'actor'"):
        ckpt.load_state_dicts({"actor": model}, {"actor": torch.nn.Linear(3, 2).state_dict()}, "x.pt")
    with pytest.raises(CheckpointError, match="no state for critic"):
        ckpt.load_state_dicts({"critic": model}, {}, "x.pt")


def test_stream_seeds_are_unrelated_to_the_run_seed_and_to_each_other():
    """TD3+BC's smoothing noise was seeded with the run's seed, as its batches are: the two generators drew the
    very same random words. A stream's seed differs from every run seed near it and from other streams'."""
    from offrl.checkpoint import SeededGenerator, stream_seed

    seeds = {stream_seed(s, name) for s in range(50) for name in ("td3_bc smoothing noise", "other")}
    assert len(seeds) == 100 and all(0 <= x < 2**63 for x in seeds) and not seeds & set(range(1000))
    assert stream_seed(3, "a") == stream_seed(3, "a")
    batches = torch.Generator().manual_seed(0)
    noise = SeededGenerator("cpu", 0, stream="td3_bc smoothing noise").generator
    assert not torch.equal(torch.randn(64, generator=batches), torch.randn(64, generator=noise))


def test_a_checkpoint_from_before_the_dynamics_model_was_saved_still_resumes(capsys):
    """MOPO/MOBILE/RAVL/MBRCSL checkpoints hold their dynamics model since a later version: an older one resumes
    with the model the run loaded (a warning says so); any other missing object is still refused."""
    import torch.nn as nn

    agent, model = nn.Linear(2, 2), nn.Linear(2, 2)
    before = model.weight.detach().clone()
    saved = {"agent": nn.Linear(2, 2).state_dict()}
    from world_models.rollout import LastRollout

    last_rollout = LastRollout()
    last_rollout.metrics = {"rollout/kept": torch.tensor(3.0)}  # whatever it holds is left as it is
    ckpt.load_state_dicts({"agent": agent, "dynamics_model": model, "last_rollout": last_rollout}, saved, "old.pt")
    assert torch.equal(agent.weight, saved["agent"]["weight"]) and torch.equal(model.weight, before)
    assert last_rollout.metrics == {"rollout/kept": torch.tensor(3.0)}
    err = capsys.readouterr().err
    assert "predates saving dynamics_model, last_rollout; resuming with the dynamics model this run loaded" in err
    assert "no rollout/* metrics logged until the next rollout round" in err
    with pytest.raises(CheckpointError, match="has no state for buffer"):
        ckpt.load_state_dicts({"agent": agent, "buffer": model}, saved, "old.pt")


def test_a_value_saved_only_since_a_later_version_is_optional_when_loading(capsys):
    """TD3+BC checkpoints its carried actor metrics since a later version (VALUES_ADDED_LATER): an older state
    loads and keeps them as built; a state missing a value that was always saved is still refused."""
    from algos.td3_bc import TD3BC

    class Agent(ckpt.Stateful):
        VALUES, VALUES_ADDED_LATER = ("updates", "actor_metrics"), ("actor_metrics",)

        def __init__(self):
            self.updates, self.actor_metrics = 0, {}

    assert TD3BC.VALUES_ADDED_LATER == ("actor_metrics",) and "actor_metrics" in TD3BC.VALUES
    agent = Agent()
    agent.load_state_dict({"updates": 7, "actor_metrics": {"actor_loss": torch.tensor(1.5)}})
    assert agent.updates == 7 and agent.actor_metrics["actor_loss"].item() == 1.5
    assert agent.state_dict()["actor_metrics"]["actor_loss"] is not agent.actor_metrics["actor_loss"]  # a copy
    agent.load_state_dict({"updates": 9})  # an older checkpoint's state
    assert agent.updates == 9 and agent.actor_metrics["actor_loss"].item() == 1.5
    assert "predates saving Agent's actor_metrics; resuming with it as built" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="state of 'agent' does not fit"):
        ckpt.load_state_dicts({"agent": agent}, {"agent": {"actor_metrics": {}}}, "old.pt")


def test_an_optimizer_keeps_the_capturable_flag_it_was_built_with():
    """A CUDA run's optimizer state says capturable=True (graph_safe, SAC's temperature): loaded as it is into a CPU
    Adam (a resume may change --device), its next step failed on an assertion."""
    weight = torch.nn.Parameter(torch.ones(3))
    cuda_built = torch.optim.Adam([weight], lr=0.1)
    weight.grad = torch.ones(3)
    cuda_built.step()
    state = cuda_built.state_dict()
    state["param_groups"][0]["capturable"] = True  # as a CUDA run wrote it
    on_cpu = torch.optim.Adam([weight], lr=0.1)
    ckpt.load_state_dicts({"opt": on_cpu}, {"opt": state}, "cuda-run.pt")
    assert on_cpu.param_groups[0]["capturable"] is False and on_cpu.state[weight]["step"] == 1
    on_cpu.step()
    assert on_cpu.state[weight]["step"] == 2


CUDA_GENERATOR_STATE = torch.arange(16, dtype=torch.uint8)  # a CUDA generator's state: seed and offset, 16 bytes


def test_a_generator_state_of_the_other_device_type_reseeds_the_stream():
    """A CPU generator's state (5056 bytes) and a CUDA one's do not fit each other: loading a CUDA run's state on
    the CPU failed. It now starts a stream seeded from the saved state, the same one each time and another for
    another state; a state that fits still restores the stream exactly."""
    from offrl.data.buffer import ReplayBuffer

    def draws(state):
        buffer = ReplayBuffer(3, 1, 100, "cpu", seed=7)
        buffer.size = 100
        buffer.load_state_dict(state)
        return buffer.sample_index(16)

    original = ReplayBuffer(3, 1, 100, "cpu", seed=5)
    original.size = 100
    saved = original.state_dict()
    assert torch.equal(draws(saved), original.sample_index(16))  # fits: the same stream goes on
    from_cuda = {**saved, "generator": CUDA_GENERATOR_STATE}
    assert torch.equal(draws(from_cuda), draws(from_cuda))
    assert not torch.equal(draws(from_cuda), draws({**saved, "generator": CUDA_GENERATOR_STATE.flip(0)}))
    stream = ckpt.SeededGenerator("cpu", 0, "noise")
    stream.load_state_dict({"state": CUDA_GENERATOR_STATE})
    again = ckpt.SeededGenerator("cpu", 1, "noise")
    again.load_state_dict({"state": CUDA_GENERATOR_STATE})
    assert torch.equal(torch.rand(4, generator=stream.generator), torch.rand(4, generator=again.generator))
    with pytest.raises(RuntimeError):  # neither device type's size: damaged, not reseeded
        ckpt.restore_generator(torch.Generator(), torch.zeros(100, dtype=torch.uint8))


def test_a_checkpoint_written_on_cuda_is_evaluated_and_resumed_on_the_cpu(tiny, tmp_path):
    """TD3+BC's checkpoint with its generators' states as a CUDA run writes them (the replay buffer's, the
    smoothing noise's, and the CUDA RNG): `offrl eval` on the CPU and a resume with --device cpu both work, the
    resume saying that its random streams start afresh (both failed with 'Expected a CPUGeneratorImplState')."""
    from conftest import PYTHON, run_cli

    common = ["--dataset", tiny, "--hidden", "32", "32", "--eval.episodes", "2", "--log.wandb", "disabled",
              "--log.no-progress", "--run.threads", "1", "--run.out-dir", str(tmp_path), "--device", "cpu"]
    run_cli(PYTHON, "-m", "algos.td3_bc", "--steps", "20", *common)
    (run_dir,) = tmp_path.glob("td3_bc/*/0-*")
    path = run_dir / "checkpoints" / "last.pt"
    state = ckpt.load(path)
    cpu_size = torch.Generator().get_state().numel()

    def as_cuda(node):
        if isinstance(node, dict):
            return {k: as_cuda(v) for k, v in node.items()}
        if isinstance(node, torch.Tensor) and node.dtype == torch.uint8 and node.numel() == cpu_size:
            replaced.append(node)
            return CUDA_GENERATOR_STATE.clone()
        return node

    replaced = []
    state["objects"] = as_cuda(state["objects"])
    assert len(replaced) >= 2  # the buffer's sampler and the target-smoothing noise
    state["rng"]["cuda"] = [CUDA_GENERATOR_STATE.clone()]
    ckpt.save(path, state)
    evaluated = run_cli(PYTHON, "-m", "offrl.cli", "eval", str(run_dir), "--device", "cpu", "--episodes", "2")
    assert "normalized" in evaluated.stdout + evaluated.stderr
    resumed = run_cli(PYTHON, "-m", "algos.td3_bc", "--steps", "30", "--resume", str(run_dir), *common)
    assert "written on cuda and is resumed on cpu" in resumed.stderr
    assert (run_dir / "final.json").exists()


def test_a_file_system_without_locks_is_named_not_taken_for_a_busy_folder(tmp_path, monkeypatch):
    """Only EAGAIN/EACCES mean another process holds the run folder; NFS without its lock daemon (ENOLCK) or a
    mount without flock (ENOSYS) refuse every lock, which the error says instead of 'in use'."""
    import errno
    import fcntl

    def refuse(fd, flags, code):
        raise OSError(code, os.strerror(code))

    for code, says in ((errno.ENOLCK, "refuses the lock"), (errno.ENOSYS, "refuses the lock"),
                       (errno.EAGAIN, "in use by another process")):
        monkeypatch.setattr(fcntl, "lockf", lambda fd, flags, code=code: refuse(fd, flags, code))
        with pytest.raises(ckpt.CheckpointError, match=says):
            ckpt.claim_run_folder(tmp_path / "run")
