"""kdml.distributed's helpers one at a time: their values on each of three gloo processes
(rank order, gradient scaling, sums that leave their input alone, who agrees on what), and
their torchrun environment handling in one process."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import time
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from distributed_harness import run_ranks
from torch import nn

from kdml import distributed
from kdml.errors import KdmlError, LocalError, QuietExit

WORLD = 3


def _every_rank(value):
    """``value`` of every rank, in rank order."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _gather_task():
    rank = dist.get_rank()
    x = (torch.arange(4, dtype=torch.float64).reshape(2, 2) + 10 * rank).requires_grad_()
    gathered = distributed.gather(x)
    weights = torch.arange(gathered.numel(), dtype=torch.float64).reshape(gathered.shape) + 1
    (gathered * weights).sum().backward()
    plain = distributed.gather(x.detach())
    labels = distributed.gather(torch.tensor([rank, rank], dtype=torch.long))
    world = distributed.world()
    return _every_rank({
        "gathered": gathered.detach(), "grad": x.grad, "weights": weights, "plain": plain,
        "labels": labels, "plain_requires_grad": plain.requires_grad,
        "world": (world.rank, world.size, world.local_rank, world.is_main,
                  world.is_distributed)})


def test_gather_keeps_rank_order_and_scales_this_ranks_gradient_by_the_world_size(tmp_path):
    ranks = run_ranks(WORLD, _gather_task, tmp_path=tmp_path)
    expected = torch.cat([torch.arange(4, dtype=torch.float64).reshape(2, 2) + 10 * rank
                          for rank in range(WORLD)])
    for rank, got in enumerate(ranks):
        assert torch.equal(got["gathered"], expected)
        assert torch.equal(got["plain"], expected) and not got["plain_requires_grad"]
        assert got["labels"].tolist() == [0, 0, 1, 1, 2, 2]
        # d(sum w * g)/dx of this rank's rows, times the world size (DDP averages it back)
        assert torch.equal(got["grad"], WORLD * got["weights"][2 * rank:2 * rank + 2])
        assert got["world"] == (rank, WORLD, rank, rank == 0, True)


def _sum_task():
    rank = dist.get_rank()
    local = torch.tensor([rank + 1.0, 2.0 * rank], dtype=torch.float64)
    total = distributed.all_reduce_sum(local)
    mean = distributed.mean_over_ranks(local)
    return _every_rank({"local": local, "total": total, "mean": mean})


def test_sums_and_means_over_ranks_are_new_tensors(tmp_path):
    ranks = run_ranks(WORLD, _sum_task, tmp_path=tmp_path)
    total = [sum(rank + 1.0 for rank in range(WORLD)), sum(2.0 * rank for rank in range(WORLD))]
    for rank, got in enumerate(ranks):
        assert got["local"].tolist() == [rank + 1.0, 2.0 * rank]  # left as it was
        assert got["total"].tolist() == total
        assert got["mean"].tolist() == [value / WORLD for value in total]


def _broadcast_task():
    rank = dist.get_rank()
    value = distributed.broadcast({"from": rank})
    module = nn.BatchNorm1d(2)
    module.running_mean.fill_(float(rank))
    module.num_batches_tracked.fill_(rank + 5)
    distributed.broadcast_buffers(module)
    calls = []

    def on_main():
        calls.append(rank)
        return f"made by rank {rank}"

    made = distributed.from_main(on_main)
    return _every_rank({"value": value, "mean": module.running_mean.tolist(),
                        "batches": int(module.num_batches_tracked), "made": made,
                        "calls": calls})


def test_rank_0s_values_and_buffers_reach_every_rank_and_from_main_runs_once(tmp_path):
    for got in run_ranks(WORLD, _broadcast_task, tmp_path=tmp_path):
        assert got["value"] == {"from": 0}
        assert got["mean"] == [0.0, 0.0] and got["batches"] == 5
        assert got["made"] == "made by rank 0"
    assert [got["calls"] for got in run_ranks(WORLD, _broadcast_task, tmp_path=tmp_path)] == [
        [0], [], []]


def _agreed_task(failing):
    rank = dist.get_rank()

    def work():
        if rank in failing:
            raise LocalError(f"no data on rank {rank}")
        return f"value of rank {rank}"

    try:
        outcome = ("ok", distributed.agreed(work))
    except QuietExit as error:  # before KdmlError, its base
        outcome = ("QuietExit", str(error))
    except KdmlError as error:
        outcome = ("KdmlError", str(error))
    return _every_rank(outcome)


@pytest.mark.parametrize(("failing", "expected"), [
    ((), [("ok", "value of rank 0"), ("ok", "value of rank 1"), ("ok", "value of rank 2")]),
    # rank 0 names the first failed rank; the others stop quietly
    ((1, 2), [("KdmlError", "rank 1: no data on rank 1"), ("QuietExit", "no data on rank 1"),
              ("QuietExit", "no data on rank 1")]),
    ((2,), [("KdmlError", "rank 2: no data on rank 2"), ("QuietExit", "no data on rank 2"),
            ("QuietExit", "no data on rank 2")]),
    # rank 0's own error comes first, as it is (not prefixed)
    ((0, 2), [("KdmlError", "no data on rank 0"), ("QuietExit", "no data on rank 0"),
              ("QuietExit", "no data on rank 0")]),
])
def test_agreed_outcomes_over_three_ranks(tmp_path, failing, expected):
    assert run_ranks(WORLD, _agreed_task, failing, tmp_path=tmp_path) == expected


def _agreed_file_error_task(failing):
    rank = dist.get_rank()

    def work():
        if rank in failing:  # its machine's copy of a file it cannot read
            raise PermissionError(13, "Permission denied", f"/data/rank{rank}.npz")
        return f"value of rank {rank}"

    try:
        outcome = ("ok", distributed.agreed(work))
    except QuietExit as error:
        outcome = ("QuietExit", str(error))
    except KdmlError as error:
        outcome = ("KdmlError", str(error))
    except OSError as error:  # rank 0's own: the CLI says it with its advice
        outcome = ("OSError", f"{error.filename}: {error.strerror}")
    return _every_rank(outcome)


@pytest.mark.parametrize(("failing", "expected"), [
    ((2,), [("KdmlError", "rank 2: /data/rank2.npz: Permission denied"),
            ("QuietExit", "/data/rank2.npz: Permission denied"),
            ("QuietExit", "/data/rank2.npz: Permission denied")]),
    ((0, 1), [("OSError", "/data/rank0.npz: Permission denied"),
              ("QuietExit", "/data/rank0.npz: Permission denied"),
              ("QuietExit", "/data/rank0.npz: Permission denied")]),
])
def test_a_file_error_one_rank_meets_alone_is_agreed_on(tmp_path, failing, expected):
    """An OSError about a file (which the CLI says in one line) raised on one rank alone while
    it built its parts (its machine's data file unreadable) had gone past agreed(): that rank
    stopped saying nothing (the CLI prints such errors on rank 0 only), and rank 0, waiting in
    the all_gather, was stopped by torchrun first, so a torchrun job ended without a word."""
    assert run_ranks(WORLD, _agreed_file_error_task, failing, tmp_path=tmp_path) == expected


def _from_main_file_error_task():
    def write():
        raise OSError(28, "No space left on device", "/runs/a/config.yaml")

    try:
        outcome = ("ok", distributed.from_main(write))
    except QuietExit as error:
        outcome = ("QuietExit", str(error))
    except OSError as error:
        outcome = ("OSError", f"{error.filename}: {error.strerror}")
    return _every_rank(outcome)


def test_a_file_error_of_rank_0s_work_stops_the_others_quietly(tmp_path):
    """An OSError about a file in rank 0's work for all (its run folder's config.yaml on a
    full disk) had gone past from_main(): rank 0 said it, and every other rank, left in the
    broadcast, added "a collective operation failed" (and torchrun named one of them, exit 1,
    as the root cause)."""
    said = "/runs/a/config.yaml: No space left on device"
    assert run_ranks(WORLD, _from_main_file_error_task, tmp_path=tmp_path) == [
        ("OSError", said), ("QuietExit", said), ("QuietExit", said)]


# Seconds rank 0 takes to say its error in the test below (its plots, on a slow disk).
SAYING_S = 2.0


class _SlowStream(io.StringIO):
    """A stderr whose writes take ``SAYING_S`` and note when each was done."""

    def __init__(self) -> None:
        super().__init__()
        self.done_at: list[float] = []

    def write(self, text: str) -> int:
        time.sleep(SAYING_S)
        written = super().write(text)
        self.done_at.append(time.time())
        return written


def _quiet_rank_task(taken: str, out: str):
    """``kdml train --out TAKEN`` on every rank: rank 0 refuses the folder (from_main), the
    others stop quietly; each rank writes what it said, its exit status and when it returned."""
    from kdml import cli

    rank = dist.get_rank()
    stream = _SlowStream() if rank == 0 else io.StringIO()
    with contextlib.redirect_stderr(stream):
        code = cli.main(["train", "jrd", "--dataset", "digits", "train.device=cpu",
                         "--no-progress", "--out", taken])
    returned = time.time()
    said_at = stream.done_at[-1] if rank == 0 and stream.done_at else None
    Path(out, f"rank{rank}.json").write_text(json.dumps(
        {"code": code, "said": stream.getvalue(), "said_at": said_at, "returned": returned}))


def test_a_quiet_rank_waits_for_rank_0_to_say_the_error(tmp_path):
    """A rank stopping on an error rank 0 says (QuietExit; NonFiniteLoss, which every rank
    meets) had returned at once: torchrun, which stops a job's other processes once one has
    stopped, then stopped rank 0 before its line where rank 0 took longer to say it (its
    plots first) than the quiet rank took to exit. It waits for rank 0's line now."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("someone's")
    out = tmp_path / "out"
    out.mkdir()
    run_ranks(2, _quiet_rank_task, str(taken), str(out), tmp_path=tmp_path)
    main, other = (json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert main["code"] == other["code"] == 2
    assert main["said"].startswith("kdml: error: ") and str(taken) in main["said"]
    assert other["said"] == ""
    assert other["returned"] >= main["said_at"]


def _bounded_wait_task():
    rank = dist.get_rank()
    start = time.monotonic()
    if rank == 1:  # rank 0 never says it is done here: the wait ends at its bound
        distributed._wait_for_main(True, 0.5)
    waited = time.monotonic() - start
    dist.barrier()
    return _every_rank(waited)


def test_a_quiet_ranks_wait_for_rank_0_is_bounded(tmp_path):
    """A rank 0 that never gets to say it (hung, or gone where the job's store is its own)
    holds a quiet rank up to the bound, then lets it stop."""
    waited = run_ranks(2, _bounded_wait_task, tmp_path=tmp_path)
    assert waited[0] < 0.5 <= waited[1] < 5.0


def _own_error_task(run_dir: str):
    """Rank 1 stops on an error of its own (kdml's CLI, a LocalError); rank 0, in a collective
    inside its Recorder, sees the collective fail: what its train.log then says."""
    from kdml import cli
    from kdml.training.recorder import Recorder
    from kdml.training.run_folder import RunFolder

    if dist.get_rank() == 1:
        def unreadable(args):
            raise LocalError("cannot decode image a/b.jpg: truncated")

        cli._COMMANDS["recipes"] = unreadable
        with contextlib.redirect_stderr(io.StringIO()):
            return cli.main(["recipes"])
    run = RunFolder(Path(run_dir))
    run.root.mkdir()
    with contextlib.suppress(RuntimeError), Recorder(run, writes=True):
        dist.all_reduce(torch.zeros(1))  # fails once rank 1 has stopped
    return run.log.read_text().splitlines()[-1].partition(" stopped: ")[2]


def test_rank_0s_train_log_names_the_error_another_rank_stopped_on_alone(tmp_path):
    """An unreadable image in rank 1's share stopped rank 1, which said so on its own output,
    and rank 0's train.log said only "a collective operation failed ...: its output says why",
    so the run folder kept no record of the cause (rank 1's output is on its own machine)."""
    assert run_ranks(2, _own_error_task, str(tmp_path / "run"), tmp_path=tmp_path) == (
        "a collective operation failed, most likely because another process of this job "
        "stopped: rank 1: cannot decode image a/b.jpg: truncated")


# ----------------------------------------------------------------- one process, no group


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_one_process_is_the_whole_world(no_torchrun):
    assert distributed.world() == distributed.World(0, 1, 0)
    assert distributed.world().is_main and not distributed.world().is_distributed
    assert not distributed.World(rank=1, size=2).is_main
    assert distributed.World(rank=1, size=2).is_distributed
    assert not distributed.launched_by_torchrun()
    assert distributed.setup(use_cuda=False) == distributed.World()
    assert not dist.is_initialized()
    x = torch.ones(2, requires_grad=True)
    assert distributed.gather(x) is x and distributed.all_reduce_sum(x) is x
    assert distributed.mean_over_ranks(x) is x and distributed.broadcast(x) is x
    assert distributed.from_main(lambda: 7) == 7 and distributed.agreed(lambda: 8) == 8
    with pytest.raises(LocalError, match="^alone$"):  # raised as it is, not named by rank
        distributed.agreed(lambda: (_ for _ in ()).throw(LocalError("alone")))
    distributed.barrier()
    distributed.teardown()


@pytest.mark.parametrize(("size", "launched"), [("1", False), ("2", True), ("8", True)])
def test_torchrun_is_told_by_world_size(no_torchrun, size, launched):
    no_torchrun.setenv("WORLD_SIZE", size)
    assert distributed.launched_by_torchrun() is launched


def test_refusals_before_the_group_are_said_by_torchruns_rank_0(no_torchrun):
    assert type(distributed.refusal("x")) is KdmlError
    no_torchrun.setenv("RANK", "1")  # without torchrun, RANK means nothing to kdml
    assert type(distributed.refusal("x")) is KdmlError
    no_torchrun.setenv("WORLD_SIZE", "2")
    refused = distributed.refusal("the message")
    assert type(refused) is QuietExit and str(refused) == "the message"
    no_torchrun.setenv("RANK", "0")
    assert type(distributed.refusal("x")) is KdmlError


def test_processes_on_this_machine_default_to_all_of_them(no_torchrun):
    assert distributed.processes_on_this_machine(4) == 4
    no_torchrun.setenv("LOCAL_WORLD_SIZE", "2")
    assert distributed.processes_on_this_machine(4) == 2


@pytest.fixture
def two_gpus(no_torchrun):
    no_torchrun.setattr(torch.cuda, "is_available", lambda: True)
    no_torchrun.setattr(torch.cuda, "device_count", lambda: 2)
    return no_torchrun


def test_cuda_and_auto_become_this_processs_own_gpu_under_torchrun(two_gpus):
    assert [distributed.device_for(name) for name in ("cuda", "auto", "cpu", "cuda:0")] == [
        "cuda", "auto", "cpu", "cuda:0"]  # one process: as given
    two_gpus.setenv("WORLD_SIZE", "4")
    assert distributed.device_for("cuda") == "cuda:0"  # LOCAL_RANK unset: 0
    two_gpus.setenv("LOCAL_RANK", "1")
    assert [distributed.device_for(name) for name in ("cuda", "auto", "cpu", "cuda:0")] == [
        "cuda:1", "cuda:1", "cpu", "cuda:0"]


def test_a_process_without_a_gpu_counts_the_whole_job_without_local_world_size(two_gpus):
    two_gpus.setenv("WORLD_SIZE", "3")
    two_gpus.setenv("LOCAL_RANK", "2")
    with pytest.raises(LocalError, match=(
            r"^torchrun started 3 processes on this machine, which has 2 visible GPUs, and each "
            r"process trains on its own GPU: start at most 2 per machine \(torchrun's "
            r"nproc_per_node\), or give train.device=cpu$")):
        distributed.device_for("auto")
    assert distributed.device_for("cpu") == "cpu"


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("message", [
    "[pair.cc:598] Connection closed by peer [127.0.0.1]:4711",
    "Broken pipe", "NCCL communicator was aborted on rank 1",
    "ProcessGroupNCCL's watchdog caught collective operation timeout",
    "the remote process exited or there was a network error",
    "CONNECTION RESET BY PEER"])
def test_each_lost_peer_message_is_a_failed_collective(one_process_group, message):
    assert distributed.failed_collective(RuntimeError(message))


def test_other_errors_are_not_a_failed_collective(one_process_group, no_torchrun):
    assert not distributed.failed_collective(RuntimeError("Tensors must be contiguous"))
    assert not distributed.failed_collective(ValueError("Broken pipe"))  # not a collective's
    assert not distributed.failed_collective(BrokenPipeError("Broken pipe"))  # an OSError
    assert distributed.failed_collective(dist.DistNetworkError("store: timed out"))
    distributed.teardown()
    assert not dist.is_initialized()
    assert not distributed.failed_collective(RuntimeError("Broken pipe"))  # no group


def test_teardown_clears_the_frames_of_an_exception_on_its_way_out(one_process_group):
    class Held:
        pass

    def fails():
        held = Held()  # noqa: F841 (a local the traceback's frame holds)
        holder.append(weakref.ref(held))
        raise RuntimeError("a bug")

    holder: list[weakref.ref] = []
    try:
        fails()
    except RuntimeError as error:
        caught = error
    gc.collect()
    assert holder[0]() is not None  # the traceback keeps it alive
    distributed.teardown(caught)
    assert holder[0]() is None and not dist.is_initialized()
    assert caught.__traceback__ is not None


def test_setup_joins_no_second_group_where_one_exists(one_process_group, no_torchrun):
    """A caller (a test harness, a script calling kdml.cli.main) may have joined the group
    already: setup takes it as it is."""
    no_torchrun.setenv("WORLD_SIZE", "2")
    assert distributed.setup(use_cuda=False) == distributed.World(0, 1, 0)
    assert dist.is_initialized()


def test_teardown_frees_a_wrapper_held_in_a_reference_cycle(one_process_group):
    """A DistributedDataParallel wrapper sits in reference cycles: clearing the frames alone
    leaves it to a later garbage collection, after the group is destroyed."""
    class Cyclic:
        pass

    def fails():
        held = Cyclic()
        held.itself = held  # a cycle: reference counting alone never frees it
        holder.append(weakref.ref(held))
        raise RuntimeError("a bug")

    holder: list[weakref.ref] = []
    gc.collect()
    gc.disable()  # only teardown's own collection may free the cycle
    try:
        try:
            fails()
        except RuntimeError as error:
            caught = error
        distributed.teardown(caught)
        assert holder[0]() is None
    finally:
        gc.enable()


def test_the_data_fingerprint_build_computed_is_the_one_data_json_records(tmp_path,
                                                                        monkeypatch):
    """Under torchrun each rank fingerprints its data at Session.build (hashing every sample)
    for the ranks' check, and rank 0 had fingerprinted it again for data.json (and on
    --resume once more to check it, a third time where data.json was rewritten): a session's
    fingerprint is now computed once and reused."""
    import json

    from distributed_harness import config_of

    from kdml.training import loading, trainer
    from kdml.training.run_folder import RunFolder

    session = trainer.Session.build(config_of("amsoftmax", ["data.dataset=digits",
                                                           "model.embedding_size=8"]),
                                    echo=lambda line: None)
    fingerprint = trainer.data_fingerprint
    calls = []

    def counted(*args):
        calls.append(args)
        return fingerprint(*args)

    monkeypatch.setattr(trainer, "data_fingerprint", counted)
    monkeypatch.setattr(loading, "data_fingerprint", counted)
    session.fingerprint = fingerprint(session.splits, session.test_part)  # as build's
    run = RunFolder(tmp_path / "run")
    with run.held():
        trainer._open_run_folder(run, session, False, lambda line: None, "")
    assert calls == []
    assert json.loads(run.data_fingerprint.read_text())["parts"] == session.fingerprint["parts"]
    session.fingerprint = None  # a single process: computed when first needed, then kept
    assert session.data_fingerprint() == session.data_fingerprint()
    assert len(calls) == 1
