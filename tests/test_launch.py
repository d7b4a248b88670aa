"""torchrun's environment variables set wrong, by hand: one line, not int()'s or torch's
traceback (kdml.launch)."""

from __future__ import annotations

import os

import pytest
import torch

from kdml import cli, launch
from kdml.data.images import ImageFiles
from kdml.data.loaders import resolve_num_workers
from kdml.errors import KdmlError, LocalError

TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_torchrun(monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def refusal(name: str, value: str, bound: str) -> str:
    return (f"the environment variable {name}={value!r} is not a whole number {bound}: "
            "torchrun sets it for the processes it starts; unset it to run in one process, or "
            "start kdml with torchrun")


def test_unset_variables_are_one_process():
    assert launch.world_size() == 1 and not launch.launched_by_torchrun()
    assert launch.launch_rank() == 0 and launch.local_rank() == 0
    assert launch.local_rank(3) == 3  # world(): the group's rank where LOCAL_RANK is unset
    assert launch.processes_on_this_machine(4) == 4


def test_torchruns_values_are_read(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert launch.world_size() == 4 and launch.launched_by_torchrun()
    assert (launch.launch_rank(), launch.local_rank(), launch.processes_on_this_machine(4)) == (
        3, 1, 2)
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node=1: one process
    assert not launch.launched_by_torchrun() and launch.launch_rank() == 0


@pytest.mark.parametrize(("name", "value", "bound", "read"), [
    ("WORLD_SIZE", "abc", "of at least 1", launch.world_size),
    ("WORLD_SIZE", "0", "of at least 1", launch.launched_by_torchrun),
    ("WORLD_SIZE", "2.0", "of at least 1", launch.world_size),
    ("LOCAL_RANK", "-1", "of at least 0", launch.local_rank),
    ("LOCAL_WORLD_SIZE", "0", "of at least 1", lambda: launch.processes_on_this_machine(1)),
    ("LOCAL_WORLD_SIZE", "", "of at least 1", lambda: launch.processes_on_this_machine(1)),
])
def test_a_variable_that_is_no_count_is_refused_in_one_line(monkeypatch, name, value, bound,
                                                            read):
    monkeypatch.setenv(name, value)
    with pytest.raises(LocalError) as refused:
        read()
    assert str(refused.value) == refusal(name, value, bound)


def test_a_rank_outside_the_world_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("2", "-1", "one"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(LocalError, match="^" + refusal("RANK", rank, "from 0 to 1") + "$"):
            launch.launch_rank()
    monkeypatch.setenv("RANK", "1")
    assert launch.launch_rank() == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "7")  # not read in a single process
    assert launch.launch_rank() == 0


def test_automatic_workers_refuse_no_processes_on_this_machine(monkeypatch):
    """LOCAL_WORLD_SIZE=0 had divided the machine's cores by zero (ZeroDivisionError)."""
    files = ImageFiles("toy", "toy", ["/nonexistent/a.png"], torch.tensor([0]), resize=8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(KdmlError, match="LOCAL_WORLD_SIZE='0' is not a whole number"):
        resolve_num_workers(-1, files)
    assert resolve_num_workers(2, files) == 2  # a count that is set needs no share


@pytest.mark.parametrize("command", [["train", "jrd", "--dataset", "digits"],
                                     ["eval", "{tmp}/run"], ["reproduce", "dtml", "--list"]],
                         ids=lambda c: c[0])
def test_commands_refuse_a_world_size_that_is_no_count(tmp_path, monkeypatch, capsys, command):
    """WORLD_SIZE=abc had stopped every command that looks for torchrun with int()'s
    ValueError traceback."""
    monkeypatch.setenv("WORLD_SIZE", "abc")
    out = tmp_path / "out"
    args = [part.format(tmp=tmp_path) for part in command]
    extra = ["--out", str(out)] if command[0] == "train" else []
    assert cli.main([*args, *extra, "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: {refusal('WORLD_SIZE', 'abc', 'of at least 1')}\n")
    assert not out.exists()


def test_a_bad_local_rank_is_said_by_its_own_rank(monkeypatch, capsys):
    """Every rank's own variable: rank 1 says it (rank 0, whose variables are right, cannot)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "x")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert cli.main(["train", "jrd", "--dataset", "digits", "--device", "cpu",
                     "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: rank 1: {refusal('LOCAL_RANK', 'x', 'from 0 to 1')}\n")


@pytest.mark.parametrize(("present", "missing"), [
    ({}, "RANK, MASTER_ADDR, MASTER_PORT are"),
    ({"RANK": "0", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is"),
    ({"RANK": "0", "MASTER_PORT": "29500", "MASTER_ADDR": ""}, "MASTER_ADDR is"),
])
def test_a_world_size_without_the_rest_of_torchruns_variables_is_refused(
        tmp_path, monkeypatch, capsys, present, missing):
    """WORLD_SIZE=2 exported by hand (a cluster's job script) had stopped kdml train with
    torch's "environment variable RANK expected, but not set" traceback."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name, value in present.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    assert cli.main(["train", "jrd", "--dataset", "digits", "--device", "cpu", "--out",
                     str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: the environment variable WORLD_SIZE='2' says this process is one of "
        f"several, but {missing} not set: start the job with torchrun, which sets them all, "
        "or unset WORLD_SIZE to train in one process\n")
    assert not out.exists()
    assert not torch.distributed.is_initialized()
