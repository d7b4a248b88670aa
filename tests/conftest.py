"""Shared fixtures: tiny, fast settings for end-to-end runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdml import cli

# The tests' tensors are tiny: one thread avoids thread start-up costs and, on a busy 2-core
# machine, oversubscription that makes tiny ops up to 100x slower.
torch.set_num_threads(1)

# Pinned to the CPU: these runs assert bit-repeatability (seed, resume), which a GPU gives only
# with train.deterministic=true (tests/test_cuda.py covers that mode).
TINY_RUN = [
    "train.epochs=2", "data.batch_size=20", "data.samples_per_class=4",
    "model.embedding_size=8", "eval.nmi=false", "train.device=cpu",
]


@pytest.fixture
def tiny_overrides() -> list[str]:
    """Overrides that make a run on ``digits`` take a few seconds."""
    return list(TINY_RUN)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A finished tiny run, trained once per test module, for the commands that read a run
    (tests that change it work on a copy)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    one_epoch = [o for o in TINY_RUN if not o.startswith("train.epochs=")]
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "train.epochs=1", *one_epoch, "--no-progress"]) == 0
    return out


@pytest.fixture
def modes_while_training(monkeypatch):
    """``watch(read)``: a list that gets ``read()`` each time a run's epochs start (when
    ``train()`` calls ``_train_session``), for the process-wide modes a run sets while it
    trains."""
    from kdml.training import trainer

    def watch(read):
        seen = []
        train_session = trainer._train_session

        def spy(*args, **kwargs):
            seen.append(read())
            return train_session(*args, **kwargs)

        monkeypatch.setattr(trainer, "_train_session", spy)
        return seen

    return watch


@pytest.fixture
def stop_in_epoch(monkeypatch):
    """``stop(epoch, error=None)``: training raises ``error`` (a Ctrl-C when None) as it starts
    epoch ``epoch``; the epochs before it train as usual. Returns ``undo()``, which puts the real
    epoch back (for a resume in the same test)."""
    from kdml.training import trainer

    real = trainer.train_one_epoch

    def stop(epoch: int, error: BaseException | None = None):
        def stopped(session, at, progress):
            if at == epoch:
                raise KeyboardInterrupt if error is None else error
            return real(session, at, progress)

        monkeypatch.setattr(trainer, "train_one_epoch", stopped)
        return lambda: monkeypatch.setattr(trainer, "train_one_epoch", real)

    return stop


@pytest.fixture
def kill_in_scoring(monkeypatch):
    """``kill(scoring)``: the ``scoring``-th scoring of the run (1-based) raises a Ctrl-C, what
    a kill leaves (no except clause of kdml's runs), after its epoch trained; the others score
    as usual. Returns ``undo()``, which puts the real scoring back (for a resume)."""
    from kdml.training import trainer

    real = trainer.score_method

    def kill(scoring: int):
        calls = []

        def killed(*args, **kwargs):
            calls.append(len(calls) + 1)
            if len(calls) == scoring:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(trainer, "score_method", killed)
        return lambda: monkeypatch.setattr(trainer, "score_method", real)

    return kill
