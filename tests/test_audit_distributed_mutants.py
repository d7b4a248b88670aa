"""The multi-process code's behaviours that a mutation audit of it found unchecked: each test
here fails on a named change of kdml.distributed, kdml.seeding or the evaluator's sharding
that the other tests let pass. Most take a fake world (torch.distributed's rank and size
patched, no process group); the gloo ones take three processes for a few seconds."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed_harness import config_of, run_ranks
from torch import nn

from kdml import distributed, launch
from kdml.errors import LocalError
from kdml.evaluation import evaluator
from kdml.seeding import AUGMENT, METHOD, StepRandom, derive_seed
from kdml.training.trainer import Session

WORLD = 3


@pytest.fixture
def fake_world(monkeypatch):
    """``set(rank, size)``: torch.distributed says this process is ``rank`` of ``size`` in a
    joined group (none exists: a collective would fail), torchrun's variables unset."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def set_world(rank: int, size: int) -> None:
        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: size)

    return set_world


def test_a_process_started_without_local_rank_is_its_global_rank_on_its_machine(fake_world):
    """Mutant: ``World.local_rank`` read as ``local_rank(0)``: every process joined without
    LOCAL_RANK (started by hand, one per machine) would be local rank 0 alike."""
    fake_world(2, 3)
    assert distributed.world() == distributed.World(rank=2, size=3, local_rank=2)


def _every_rank_task():
    rank = dist.get_rank()
    return distributed.every_rank({"rank": rank, "items": list(range(rank))})


def test_every_rank_gives_each_ranks_value_in_rank_order(tmp_path):
    """Mutant: ``every_rank`` in another order: the cross-rank check of the settings and the
    data (check_same_run) would name the wrong rank as the one that differs."""
    assert run_ranks(WORLD, _every_rank_task, tmp_path=tmp_path) == [
        {"rank": rank, "items": list(range(rank))} for rank in range(WORLD)]


@pytest.mark.parametrize("count", [1, 2, 5, 6, 7, 1077])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_rank_shares_are_equal_contiguous_and_cover_every_sample_once_after_the_gather(
        fake_world, count, size):
    """:func:`rank_share` against a float-free count: every rank the same number of positions
    (gather needs it), ranks in order, each sample in some share, and only the last samples
    repeated as padding."""
    shares = []
    for rank in range(size):
        fake_world(rank, size)
        shares.append(evaluator.rank_share(count))
    assert len({len(share) for share in shares}) == 1
    joined = torch.cat(shares).tolist()
    assert joined == sorted(joined)
    assert sorted(set(joined)) == list(range(count))
    expected_length = -(-count // size)
    assert len(shares[0]) == expected_length
    assert joined[:count] == list(range(count))
    assert set(joined[count:]) <= {count - 1}


def test_a_step_s_rank_key_is_part_of_its_streams():
    """Mutant: ``StepRandom`` dropping its ``rank`` key: the draws its docstring says should
    differ between processes would be the same on every rank. The trainer passes 0 (every
    rank draws the global batch's randomness), which must stay the seed of rank 0's keys."""
    for stream in (AUGMENT, METHOD):
        ranks = [StepRandom(3, 1, 2, rank=rank).seed(stream) for rank in range(WORLD)]
        assert ranks == [derive_seed(3, 1, 2, rank, stream) for rank in range(WORLD)]
        assert len(set(ranks)) == WORLD
        assert StepRandom(3, 1, 2).seed(stream) == ranks[0]


def test_store_keys_are_those_of_this_attempt_of_the_job(monkeypatch):
    """Mutant: the store keys without torchrun's restart count: torchrun's store outlives a
    restart (--max-restarts), so a restarted job's quiet ranks would find the failed
    attempt's "rank 0 has said" at once, and rank 0 the old attempt's stopped ranks."""
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    first = distributed._store_key("rank-stopped", 1)
    assert first == "kdml/rank-stopped/0/1"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert distributed._store_key("rank-stopped", 1) == "kdml/rank-stopped/2/1"
    assert distributed._store_key("rank-0-has-said") == "kdml/rank-0-has-said/2"


@pytest.mark.parametrize("helper", [distributed.from_main, distributed.agreed])
def test_an_os_error_about_no_file_keeps_its_traceback_before_any_collective(fake_world,
                                                                             helper):
    """Mutant: every OSError taken as one said in a line: a bug's OSError (no file named:
    a socket's, a bad argument's) would be sent to the other ranks as a one-line error, its
    traceback lost. It is raised as it is, on rank 0, before the collective (none exists in
    this fake world: a collective would fail with torch's own error)."""
    fake_world(0, 2)
    bug = OSError(22, "Invalid argument")

    def work():
        raise bug

    with pytest.raises(OSError) as raised:
        helper(work)
    assert raised.value is bug
    assert not distributed._said_in_a_line(bug)
    assert distributed._said_in_a_line(OSError(28, "No space left on device", "/run/x"))


TORCHRUN_VARIABLES = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
                      "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": "65535"}


@pytest.mark.parametrize(("name", "value", "bound"), [
    ("RANK", "2", "from 0 to 1"),
    ("MASTER_PORT", "65536", "from 1 to 65535"),
    ("MASTER_PORT", "0", "from 1 to 65535"),
])
def test_the_rendezvous_check_reads_rank_and_the_port_against_their_bounds(
        monkeypatch, name, value, bound):
    """Mutants: check_rendezvous without its read of RANK (a RANK beyond WORLD_SIZE went to
    torch's rendezvous, which waits for a rank that never comes), or a port bound of 65536."""
    for variable, setting in TORCHRUN_VARIABLES.items():
        monkeypatch.setenv(variable, setting)
    launch.check_rendezvous()  # the highest port and rank there are pass
    monkeypatch.setenv(name, value)
    with pytest.raises(LocalError, match=rf"^the environment variable {name}={value!r} is not "
                                         rf"a whole number {bound}: "):
        launch.check_rendezvous()


def _score_with_statistics_of_each_rank(overrides):
    """``Session.score`` of a fresh model whose BatchNorm statistics differ on each rank, as
    each rank's forward updates its own from its share of the batch: the scored row."""
    session = Session.build(config_of("amsoftmax", overrides), echo=lambda line: None)
    rank = dist.get_rank() if dist.is_initialized() else 0
    norms = [module for module in session.method.modules()
             if isinstance(module, nn.modules.batchnorm._BatchNorm)]
    assert norms
    for module in norms:
        module.running_mean.add_(0.5 * rank)
        module.running_var.mul_(1.0 + rank)
    row = {"epoch": 1}
    session.score(1, row, progress=False)
    return row


@pytest.mark.slow
def test_ranks_score_their_test_shares_with_rank_0s_batchnorm_statistics(tmp_path):
    """Mutant: ``Session.score`` without its broadcast of the buffers: rank 1 embedded its
    half of the test set with its own statistics, and the scores were of no one's model
    (rank 0's is the one saved); with it they are the single process's of rank 0's model."""
    overrides = ["data.dataset=digits", "model.embedding_size=8", "model.backbone=cnn",
                 "model.freeze_bn=false", "eval.nmi=false"]
    single = run_ranks(1, _score_with_statistics_of_each_rank, overrides, tmp_path=tmp_path)
    double = run_ranks(2, _score_with_statistics_of_each_rank, overrides, tmp_path=tmp_path)
    assert double == single


def _echoed_lines(run_dir, overrides):
    """``train``'s lines echoed on each rank, and the metrics it returned there."""
    from pathlib import Path

    from kdml.training.trainer import train

    lines: list[str] = []
    metrics = train(config_of("jrd", overrides), Path(run_dir), progress=False,
                    echo=lines.append, start_line="training jrd")
    return distributed.every_rank((lines, metrics))


@pytest.mark.slow
def test_rank_0_alone_echoes_a_torchrun_runs_lines(tmp_path):
    """Mutant: ``train``'s ``echo`` given to the other ranks instead of rank 0: the lines
    ("test set: ...", the start line) came once per process but rank 0's, and every rank
    must still return rank 0's metrics."""
    overrides = ["data.dataset=digits", "model.embedding_size=8", "train.epochs=1",
                 "train.steps_per_epoch=2", "data.batch_size=40", "eval.nmi=false"]
    (main_lines, main_metrics), (other_lines, other_metrics) = run_ranks(
        2, _echoed_lines, str(tmp_path / "run"), overrides, tmp_path=tmp_path)
    assert "training jrd" in main_lines
    assert any(line.startswith("test set: ") for line in main_lines)
    assert other_lines == []
    assert other_metrics == main_metrics


@pytest.mark.parametrize(("precision", "dtype", "scaled"), [
    ("fp32", None, False), ("bf16", torch.bfloat16, False), ("fp16", torch.float16, True)])
def test_each_precision_gets_its_autocast_and_only_float16_a_loss_scaler(precision, dtype,
                                                                         scaled):
    """Mutants: a loss scaler enabled for bfloat16 too (whose range needs none), autocast
    under fp32, or the two low precisions' dtypes swapped."""
    from kdml.precision import autocast, gradient_scaler

    cpu = torch.device("cpu")
    assert gradient_scaler(cpu, precision).is_enabled() is scaled
    with autocast(cpu, precision):
        assert torch.is_autocast_enabled("cpu") is (dtype is not None)
        if dtype is not None:
            assert torch.get_autocast_dtype("cpu") == dtype
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype
