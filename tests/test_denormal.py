"""train.flush_denormal: subnormal floats flushed to zero while a run trains, and only then."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from kdml import cli
from kdml.training.denormal import (
    SUBNORMAL,
    flushes_denormals,
    flushing_denormals,
)

PARTIAL = "train.flush_denormal=true reaches this process's main thread only"


@pytest.fixture(autouse=True)
def _restore_mode():
    """Each test leaves the process's mode as it found it, whatever it asserts."""
    before = flushes_denormals()
    yield
    torch.set_flush_denormal(before)


def test_the_mode_read_back_is_the_mode_set():
    assert torch.finfo(torch.float32).tiny > SUBNORMAL  # the probe is subnormal
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal floats (no SSE3 / FZ)")
    assert flushes_denormals()
    assert (torch.tensor([SUBNORMAL]) * 2.0)[0] == 0
    torch.set_flush_denormal(False)
    assert not flushes_denormals()
    assert (torch.tensor([SUBNORMAL]) * 2.0)[0] == pytest.approx(2 * SUBNORMAL, rel=1e-3)


@pytest.mark.parametrize("before", [False, True])
def test_the_block_flushes_and_the_mode_before_comes_back(before):
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal floats (no SSE3 / FZ)")
    torch.set_flush_denormal(before)
    said = []  # the pytest process's worker threads may predate the mode: said so, if so
    with flushing_denormals(True, echo=said.append):
        assert flushes_denormals()
    assert all(line.startswith(PARTIAL) for line in said)
    assert flushes_denormals() == before
    with pytest.raises(RuntimeError, match="inside"), flushing_denormals(True):
        raise RuntimeError("inside")
    assert flushes_denormals() == before  # restored after an error too
    with flushing_denormals(False, echo=pytest.fail):
        assert flushes_denormals() == before  # off: the mode is left alone


WORKERS_FIRST = """
import torch
from kdml.training.denormal import SUBNORMAL, flushing_denormals, unflushed_share
torch.set_num_threads(2)
torch.full((1 << 21,), SUBNORMAL) * 1.0  # torch's workers start, not flushing
if not torch.set_flush_denormal(True):
    print("cannot flush")
else:
    torch.set_flush_denormal(False)
    with flushing_denormals(True):
        print(f"share {unflushed_share():.2f}")
"""


def test_worker_threads_started_before_the_mode_are_said_to_keep_subnormals():
    """torch.set_flush_denormal sets the calling thread's mode: worker threads already running
    (a grid's later cells, a library caller) kept subnormal floats in their share of every
    parallel computation, without a word, while the docs said "per process". In a process of
    its own (workers never started before the mode: their mode is not resettable after)."""
    result = subprocess.run([sys.executable, "-c", WORKERS_FIRST], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr
    if result.stdout == "cannot flush\n":
        pytest.skip("this CPU cannot flush subnormal floats (no SSE3 / FZ)")
    *said, share = result.stdout.splitlines()
    if share == "share 0.00":  # an OpenMP that hands the mode on to its workers: all flushed
        assert said == []
        return
    assert share == "share 0.50"  # the main thread's half of the product flushed, not the rest
    assert said == [f"{PARTIAL}: torch's worker threads, started before it, keep subnormal "
                    "floats (a share 0.50 of a parallel product's); train the run in a process "
                    "of its own (kdml train) for all of them"]


def test_a_cpu_that_cannot_flush_says_so_and_runs_the_block(monkeypatch):
    said, ran = [], []
    monkeypatch.setattr(torch, "set_flush_denormal", lambda mode: False)
    with flushing_denormals(True, echo=said.append):
        ran.append(True)
    assert ran == [True]
    assert said == ["train.flush_denormal=true: this CPU cannot flush subnormal floats to "
                    "zero; training with them"]


def test_a_run_flushes_while_it_trains_and_a_resume_can_turn_it_on(tmp_path, tiny_overrides,
                                                                   modes_while_training):
    """The epochs run with the mode on, the process gets its mode back after, and a run
    slowed down by subnormal floats can be resumed with the setting (the measured case)."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal floats (no SSE3 / FZ)")
    torch.set_flush_denormal(False)
    modes = modes_while_training(flushes_denormals)
    run = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(run),
                     *tiny_overrides, "train.epochs=1", "--no-progress"]) == 0
    assert modes == [False]  # off by default: PyTorch's mode
    config = run / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    assert settings["train"]["flush_denormal"] is False
    settings["train"]["flush_denormal"], settings["train"]["epochs"] = True, 2
    config.write_text(yaml.safe_dump(settings))
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert modes == [False, True]
    assert not flushes_denormals()
    assert [row["epoch"] for row in json.loads((run / "metrics.json").read_text())["epochs"]
            ] == [1, 2]
