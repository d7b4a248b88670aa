"""kdml under torchrun, as a fuzzing session found it mishandled: a run trained with a
multi-process-only setting resumed in one process, usage errors and output said once per rank,
and LOCAL_RANK / LOCAL_WORLD_SIZE out of range."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from kdml import cli

TINY = ["train", "jrd", "--dataset", "digits", "--no-progress", "train.epochs=1",
        "train.steps_per_epoch=1", "data.batch_size=40", "model.embedding_size=8",
        "model.freeze_bn=true", "eval.nmi=false", "train.device=cpu"]


def _as_trained_with(run: Path, section: str, key: str, value: object) -> None:
    """Make ``run`` (trained in one process) look as a torchrun job with ``section.key=value``
    left it: its checkpoint's config and its config.yaml both hold the setting."""
    checkpoint_path = run / "checkpoints" / "last.pt"
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    checkpoint["config"][section][key] = value
    torch.save(checkpoint, checkpoint_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config[section][key] = value
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def _set_in_yaml(run: Path, section: str, key: str, value: object) -> None:
    config = yaml.safe_load((run / "config.yaml").read_text())
    config[section][key] = value
    (run / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.mark.parametrize(("section", "key"), [("train", "sharded_kernels"),
                                              ("model", "sync_bn")])
def test_a_run_with_a_multiprocess_only_setting_resumes_as_the_refusal_advises(
        tmp_path, capsys, section, key):
    """A run trained under torchrun with train.sharded_kernels=true (same value and gradient
    as the full gather) or on GPUs with model.sync_bn=true cannot be resumed in one process /
    on the CPU: the first refusal says "drop it", and dropping it in config.yaml is refused as
    an edit --resume does not take ("put the setting back"). Either the setting should be one
    --resume takes a change of, or the run should resume with it left as trained."""
    run = tmp_path / "run"
    assert cli.main([*TINY, "--out", str(run)]) == 0
    _as_trained_with(run, section, key, True)
    _set_in_yaml(run, "train", "epochs", 2)
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 2
    said = capsys.readouterr().err
    assert "drop it" in said, said
    _set_in_yaml(run, section, key, False)  # do as told
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0, \
        capsys.readouterr().err
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=False)["epoch"] == 2


@pytest.mark.parametrize("argv", [["bogus"], ["train", "jrd", "--bogus"]])
def test_usage_errors_under_torchrun_are_said_by_rank_0_alone(monkeypatch, capsys, argv):
    """Every rank printed argparse's one-line error (an unknown command or option), so a
    2-process job showed it twice; other errors before the process group are said by rank 0
    alone (test_distributed.py::test_errors_before_the_process_group_are_said_by_rank_0_alone)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith("kdml: error: ")


@pytest.mark.parametrize(("local_rank", "local_world_size"), [("5", "2"), ("0", "7")])
def test_a_local_rank_outside_this_machines_processes_is_refused(monkeypatch, local_rank,
                                                                 local_world_size):
    """README: a LOCAL_RANK or LOCAL_WORLD_SIZE "that is no count in range" is refused in one
    line before anything starts. LOCAL_RANK=5 of LOCAL_WORLD_SIZE=2 (or LOCAL_WORLD_SIZE=7 in a
    WORLD_SIZE of 2) passed the checks, and the process waited for its peers, saying nothing."""
    from kdml import launch
    from kdml.errors import KdmlError

    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29500"), ("LOCAL_RANK", local_rank),
                        ("LOCAL_WORLD_SIZE", local_world_size)):
        monkeypatch.setenv(name, value)
    with pytest.raises(KdmlError) as refused:
        launch.check_rendezvous()
    name, value, bound = (("LOCAL_RANK", local_rank, "from 0 to 1") if local_rank == "5" else
                          ("LOCAL_WORLD_SIZE", local_world_size, "from 1 to 2"))
    assert str(refused.value).startswith(f"the environment variable {name}='{value}' is not a "
                                         f"whole number {bound}: torchrun sets it")


def test_only_rank_0_prints_the_output_of_a_command_under_torchrun(monkeypatch, capsys):
    """kdml config, recipes, datasets and --help printed their whole output once per rank:
    `torchrun --nproc_per_node 2 -m kdml config jrd > file` held the YAML twice."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, printed in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(["config", "jrd"]) == 0
        assert ("recipe: jrd" in capsys.readouterr().out) == printed
        assert cli.main(["recipes"]) == 0
        assert bool(capsys.readouterr().out) == printed
        assert cli.main(["train", "--help"]) == 0
        assert bool(capsys.readouterr().out) == printed


def test_an_unreadable_image_under_torchrun_is_not_told_to_skip_as_torchrun_refuses(
        monkeypatch):
    """The unreadable-image refusal advised data.on_bad_image=skip, which torchrun's
    processes then refuse (their batches would be unequal): under torchrun it says to resume in
    one process for that."""
    from kdml.data import loaders
    from kdml.errors import LocalError

    class Unreadable:
        def source_of(self, index):
            return "photos/cat/0.png"

        def place_of(self, index):  # a folder's image: listed in no file
            return ""

    batch = loaders.Batch(torch.zeros(2, 3), torch.tensor([0, 1]), torch.tensor([0, 1]),
                          torch.tensor([True, False]))
    monkeypatch.setattr(loaders, "decode_failure", lambda dataset, index: "truncated")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LocalError) as refused:
        list(loaders.readable_batches([batch], Unreadable(), "error"))
    assert str(refused.value).endswith(
        "or resume it in one process with data.on_bad_image=skip in its config.yaml (torchrun's "
        "processes cannot skip: their batches would be unequal)")


def test_a_process_waiting_for_its_peers_says_so(monkeypatch, capsys):
    """WORLD_SIZE, RANK and MASTER_* set by hand, with no other process started: the process
    had waited for gloo's 30 minutes without a word. After distributed.JOIN_NOTICE_S it says
    what it waits for (shortened here, the join faked); a join in time says nothing."""
    import time

    from kdml import distributed

    for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29511"), ("LOCAL_RANK", "1"),
                        ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    import threading

    said = threading.Event()
    notice = distributed._say_still_waiting

    def say_then_mark() -> None:
        notice()
        said.set()

    monkeypatch.setattr(distributed, "JOIN_NOTICE_S", 0.05)
    monkeypatch.setattr(distributed, "_say_still_waiting", say_then_mark)
    # a join that takes until the notice is out (at most 30 s on a very loaded machine)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda *args, **kwargs: said.wait(30))
    distributed.setup(use_cuda=False)
    assert capsys.readouterr().err == (
        "kdml: rank 1 has waited 0.05 s at 127.0.0.1:29511 for the job's 2 processes "
        "(WORLD_SIZE) to join; it waits up to 30 minutes: start the others (torchrun starts "
        "them all), or stop this one and unset WORLD_SIZE to train in one process\n")
    monkeypatch.setattr(distributed, "JOIN_NOTICE_S", 0.2)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *args, **kwargs: None)
    distributed.setup(use_cuda=False)
    time.sleep(0.5)  # past the notice's time: cancelled by the join, it never comes
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("error", "said"), [
    ("local", "kdml: error: rank 1: grid cell alpha=0.1 failed: cannot decode image "
              "a/b.png: truncated -- "),
    ("every rank", ""),  # rank 0 says those
])
def test_an_error_one_rank_meets_alone_in_a_grid_cell_is_said_by_that_rank(
        tmp_path, monkeypatch, capsys, error, said):
    """A grid under torchrun, an unreadable image in rank 1's share of a cell's batch: the
    grid made the rank's LocalError a plain KdmlError ("grid cell ... failed: ..."), which a
    rank other than 0 does not print, and rank 0 saw only "a collective operation failed ...
    its output says why": no process said why. (The process group is left out: rank 1's
    printing is what is faked.)"""
    from kdml.cli import output
    from kdml.errors import KdmlError, LocalError
    from kdml.training import trainer

    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: jrd\ndata:\n  dataset: digits\ngrid:\n  method.alpha: [0.1, 1.0]\n")

    def failing_cell(*args, **kwargs):
        if error == "local":
            raise LocalError("cannot decode image a/b.png: truncated")
        raise KdmlError("every rank meets this")

    monkeypatch.setattr(trainer, "train", failing_cell)
    monkeypatch.setattr(cli, "_is_main_process", lambda: False)  # as rank 1 of 2
    monkeypatch.setattr(output, "_rank", lambda: 1)
    monkeypatch.setattr(cli, "_rank", lambda: 1)
    assert cli.main(["train", "--config", str(grid), "--no-progress",
                     "--out", str(tmp_path / "grid")]) == 2
    printed = capsys.readouterr().err
    assert printed.startswith(said) if said else printed == ""
