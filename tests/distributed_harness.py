"""Run kdml's training steps and evaluation in several gloo processes, for the tests.

``run_ranks(world, task, *args)`` starts ``world`` processes (torch.multiprocessing, gloo on
the CPU, as torchrun would) that each call ``task(*args)`` after joining the process group;
what rank 0 returns comes back. ``world = 1`` runs the task in this process, without a group.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kdml.config import resolve_config
from kdml.evaluation.evaluator import evaluate_method
from kdml.training.recipes import get_recipe
from kdml.training.trainer import Session, train_one_epoch


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, task, args) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    # a rank left waiting on the others fails the test in minutes, not torch's 30
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(minutes=2))
    try:
        result = task(*args)
        if rank == 0:
            torch.save(result, out)
    finally:
        if dist.is_initialized():  # kdml's CLI frees it itself
            dist.destroy_process_group()


# fork starts ranks fastest, but a process that has run autograd on a GPU cannot fork children
# that run autograd (PyTorch's "Autograd and Fork" note); on a GPU machine the CUDA tests have.
# Then the ranks come from a fork server, a clean process that imports torch and kdml once.
mp.set_forkserver_preload(["torch", "kdml.training.trainer", __name__])


def start_method() -> str:
    return "forkserver" if torch.cuda.is_initialized() else "fork"


# Every task here takes seconds; a rank that waits on a collective the others never make
# (an object broadcast one rank skips) outlived gloo's 2-minute timeout, and would hold the
# test (and CI) until its global limit.
RANKS_TIMEOUT_S = 300


def run_ranks(world: int, task, *args: Any, tmp_path: Path) -> Any:
    if world == 1:
        return task(*args)
    out = str(tmp_path / f"result-{task.__name__}-{free_port()}.pt")
    ranks = mp.start_processes(_worker, args=(world, free_port(), out, task, args),
                               nprocs=world, start_method=start_method(), join=False)
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    while not ranks.join(timeout=max(0.0, deadline - time.monotonic())):  # raises if one fails
        if time.monotonic() >= deadline:
            for process in ranks.processes:
                process.kill()
            raise AssertionError(f"{task.__name__}: the {world} ranks had not finished after "
                                 f"{RANKS_TIMEOUT_S} s (one waits on a collective the others "
                                 "never make?)")
    return torch.load(out, weights_only=False)


def config_of(recipe_name: str, overrides: list[str]):
    recipe = get_recipe(recipe_name)
    return resolve_config(recipe.name, recipe.params, recipe.defaults,
                          overrides=[*overrides, "train.device=cpu", "data.num_workers=0"])


def train_steps(recipe_name: str, overrides: list[str]) -> dict[str, Any]:
    """One epoch of ``train.steps_per_epoch`` steps: the epoch's loss terms and the
    parameters after it, and the terms of every rank."""
    session = Session.build(config_of(recipe_name, overrides), echo=lambda line: None)
    terms = train_one_epoch(session, 1, progress=False)
    state = {key: value.detach().double().clone()
             for key, value in session.method.state_dict().items()
             if value.is_floating_point()}
    every_rank = [terms]  # rank 0 logs its terms: each is the global batch's, on every rank
    if dist.is_initialized():
        every_rank = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(every_rank, terms)
    return {"terms": terms, "state": state, "terms_of_every_rank": every_rank}


def evaluate_untrained(recipe_name: str, overrides: list[str]) -> dict[str, float]:
    """The test metrics of the freshly built (seeded) method."""
    session = Session.build(config_of(recipe_name, overrides), echo=lambda line: None)
    return evaluate_method(session.method, session.splits, session.config.eval,
                           session.embedder)


def evaluate_failing_on_rank_0(recipe_name: str, overrides: list[str], out_dir: str) -> str:
    """``evaluate_method`` when scoring (rank 0's part) raises: each rank writes to
    ``out_dir`` which error it got."""
    from kdml.errors import KdmlError
    from kdml.evaluation import evaluator

    session = Session.build(config_of(recipe_name, overrides), echo=lambda line: None)

    def failing(*args: Any, **kwargs: Any) -> dict[str, float]:
        raise KdmlError("scoring failed")

    evaluator._score = failing
    return _outcome_on_this_rank(lambda: evaluate_method(
        session.method, session.splits, session.config.eval, session.embedder), out_dir)


def _outcome_on_this_rank(call: Any, out_dir: str) -> str:
    """Run ``call`` and write to ``out_dir`` which error this rank got ("no error" if none)."""
    from kdml.errors import KdmlError, QuietExit

    try:
        call()
        outcome = "no error"
    except QuietExit as error:  # before KdmlError, its base
        outcome = f"QuietExit: {error}"
    except KdmlError as error:
        outcome = f"KdmlError: {error}"
    except RuntimeError as error:  # a collective that lost its peer or timed out
        outcome = f"RuntimeError: {str(error).splitlines()[0]}"
    Path(out_dir, f"rank-{dist.get_rank()}.txt").write_text(outcome)
    return outcome


def build_failing_on_rank_1(recipe_name: str, overrides: list[str], out_dir: str) -> str:
    """``Session.build`` where rank 1 alone cannot read its data (a machine without the data
    folder): each rank writes to ``out_dir`` which error it got."""
    from kdml.errors import KdmlError
    from kdml.training import trainer

    if dist.get_rank() == 1:
        def no_data(*args: Any, **kwargs: Any) -> Any:
            raise KdmlError("folder:imgs: no such folder")

        trainer.prepare_data_and_test_part = no_data
    return _outcome_on_this_rank(
        lambda: Session.build(config_of(recipe_name, overrides), echo=lambda line: None),
        out_dir)


def score_diverged(recipe_name: str, overrides: list[str], out_dir: str) -> str:
    """``Session.score`` of a model whose test embeddings overflow: each rank writes to
    ``out_dir`` the kind of error it got."""
    session = Session.build(config_of(recipe_name, overrides), echo=lambda line: None)
    session.method.embed = lambda inputs: torch.full((len(inputs), 8), float("inf"))
    try:
        session.score(1, {"epoch": 1})
        outcome = "no error"
    except Exception as error:  # noqa: BLE001 - the kind is what the test compares
        outcome = type(error).__name__
    Path(out_dir, f"rank-{dist.get_rank()}.txt").write_text(outcome)
    return outcome


def epoch_weights_with_rank_statistics(overflowed_rank: int, out_dir: str) -> str:
    """The epoch-end weight check of a BatchNorm model whose running variance overflowed on
    ``overflowed_rank`` only (each rank's statistics of its own share): each rank writes to
    ``out_dir`` the kind of error it got, then its running variance."""
    from kdml.training.nonfinite import NonFiniteLoss
    from kdml.training.trainer import check_epoch_weights

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    torch.nn.init.ones_(model[0].weight)  # the same parameters on every rank, as under DDP
    if dist.get_rank() == overflowed_rank:
        model[1].running_var.fill_(float("inf"))
    try:
        check_epoch_weights(model, 1, 3)
        outcome = "no error"
    except NonFiniteLoss as error:
        outcome = type(error).__name__
    Path(out_dir, f"rank-{dist.get_rank()}.txt").write_text(
        f"{outcome} {model[1].running_var.tolist()}")
    return outcome


def loss_non_finite_on_one_rank(recipe_name: str, overrides: list[str], bad_rank: int,
                                bad_step: int, out_dir: str) -> str:
    """One epoch of ``train_one_epoch`` in which ``bad_rank``'s loss terms alone are NaN at
    step ``bad_step`` (0-based), as the loss of that rank's share alone could overflow: each
    rank writes to ``out_dir`` which error it got."""
    from kdml.training import nonfinite

    observe = nonfinite.NonFiniteWatch.observe

    def observe_on_rank(watch: Any, step: int, terms: dict[str, torch.Tensor]) -> None:
        if dist.get_rank() == bad_rank and step == bad_step:
            terms = {name: value * float("nan") for name, value in terms.items()}
        observe(watch, step, terms)

    nonfinite.NonFiniteWatch.observe = observe_on_rank  # type: ignore[method-assign]
    session = Session.build(config_of(recipe_name, overrides), echo=lambda line: None)
    return _outcome_on_this_rank(lambda: train_one_epoch(session, 1, progress=False), out_dir)


def non_finite_reads(recipe_name: str, overrides: list[str], bad_step: int) -> dict[str, Any]:
    """One epoch of ``train_one_epoch`` whose loss terms are NaN at step ``bad_step`` (0-based)
    on every rank: after how many steps each read of the non-finite watch came, and the error
    that stopped the epoch."""
    from kdml.training import nonfinite

    watch_class = nonfinite.NonFiniteWatch
    observe, check = watch_class.observe, watch_class.check
    steps, reads = [0], []

    def observing(watch: Any, step: int, terms: dict[str, torch.Tensor]) -> None:
        steps[0] += 1
        if step == bad_step:
            terms = {name: value * float("nan") for name, value in terms.items()}
        observe(watch, step, terms)

    def reading(watch: Any, epoch: int) -> None:
        reads.append(steps[0])
        check(watch, epoch)

    watch_class.observe, watch_class.check = observing, reading  # type: ignore[method-assign]
    try:  # in this process where the world is 1
        session = Session.build(config_of(recipe_name, overrides), echo=lambda line: None)
        try:
            train_one_epoch(session, 1, progress=False)
            said = "no error"
        except nonfinite.NonFiniteLoss as error:
            said = str(error)
    finally:
        watch_class.observe, watch_class.check = observe, check  # type: ignore[method-assign]
    return {"reads": reads, "said": said}


def build_on_own_settings(recipe_name: str, overrides: list[str], own: list[list[str]],
                          out_dir: str) -> str:
    """``Session.build`` where rank K adds ``own[K]`` to ``overrides`` (machines with their
    own copies of the data, or of a config file): each rank writes to ``out_dir`` which error
    it got."""
    config = config_of(recipe_name, [*overrides, *own[dist.get_rank()]])
    return _outcome_on_this_rank(lambda: Session.build(config, echo=lambda line: None), out_dir)


def write_domains(path: Path, seed: int = 0) -> Path:
    """A two-domain feature file: 4 source classes of 20, a shifted target of 60."""
    rng = np.random.default_rng(seed)
    source_y = np.repeat(np.arange(4), 20)
    source = rng.standard_normal((4, 16))[source_y] + 0.5 * rng.standard_normal((80, 16))
    target_y = rng.integers(0, 4, 60)
    target = rng.standard_normal((4, 16))[target_y] + 0.3
    np.savez(path, X=np.concatenate([source, target]).astype(np.float32),
             y=np.concatenate([source_y, target_y]),
             domain=np.array(["source"] * 80 + ["target"] * 60))
    return path


def collective_failures() -> tuple[bool, bool, str]:
    """Rank 0's view of two failed collectives: a programming error (an all_gather into a list
    of the wrong length) while every rank lives, then an all_reduce after rank 1 has died.
    Returns whether kdml's CLI takes each for a dead peer, and the second's message."""
    import time

    from kdml import cli

    tensor = torch.zeros(2)
    mistake = None
    if dist.get_rank() == 0:
        try:
            dist.all_gather([tensor, tensor, tensor], tensor)  # 3 outputs for 2 ranks
        except RuntimeError as error:
            mistake = error
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(0)  # as a rank killed by the kernel's out-of-memory killer, say
    time.sleep(1.0)
    try:
        dist.all_reduce(tensor)
    except RuntimeError as error:
        assert mistake is not None
        return cli._failed_collective(mistake), cli._failed_collective(error), str(error)
    raise AssertionError("the all_reduce with a dead rank did not fail")
