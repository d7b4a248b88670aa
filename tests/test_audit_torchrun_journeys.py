"""kdml under torchrun as users run it, as an exploratory audit found it (CPU, gloo, 2
processes): kdml's own warnings during training said once, by rank 0, in kdml's form; and an
error every process meets before the processes join (a command that refuses torchrun, a usage
error, a bad setting) said by rank 0 before torchrun stops it, the other ranks waiting for
its word on torchrun's store (here a store this test holds, as torchrun's agent does)."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import pytest
from distributed_harness import config_of, run_ranks, write_domains

from kdml import distributed
from kdml.run_log import PACKAGE_FOLDER

pytestmark = pytest.mark.slow


def _warnings_of_each_rank(run_dir: str, overrides: list[str]) -> list[tuple[list[str], str]]:
    """Train dtml into ``run_dir``; on every rank, the warnings raised in kdml's code that
    reached Python's own display (it prints them bare, with kdml's source line), and what
    the rank wrote on stderr."""
    from kdml.training.trainer import train

    said = io.StringIO()
    with warnings.catch_warnings(record=True) as shown, contextlib.redirect_stderr(said):
        warnings.simplefilter("always")
        train(config_of("dtml", overrides), Path(run_dir), progress=False,
              echo=lambda line: None)
    bare = [str(caught.message) for caught in shown
            if str(Path(caught.filename).resolve()).startswith(PACKAGE_FOLDER)]
    return distributed.every_rank((bare, said.getvalue()))


def test_kdml_s_warnings_while_training_are_said_once_by_rank_0(tmp_path):
    """MarginalFisherLoss warns of batches with fewer same-class neighbours than k1 (here 3
    for k1=5). Every rank computes the same global objective and so meets the same warning:
    rank 0 said it as ``kdml: warning: ...`` (and in train.log), and rank 1 printed it again
    as Python's bare two lines naming kdml's source file, since only rank 0's training routed
    kdml's warnings (run_logging)."""
    features = write_domains(tmp_path / "domains.npz")
    overrides = [f"data.dataset=npz:{features}", "data.batch_size=16",
                 "data.samples_per_class=4", "train.epochs=1", "train.steps_per_epoch=1",
                 "eval.nmi=false"]
    (main_bare, main_said), (other_bare, other_said) = run_ranks(
        2, _warnings_of_each_rank, str(tmp_path / "run"), overrides, tmp_path=tmp_path)
    warned = [line for line in main_said.splitlines() if "MarginalFisherLoss" in line]
    assert len(warned) == 1 and warned[0].startswith("kdml: warning: MarginalFisherLoss: "), \
        main_said
    assert main_bare == []
    assert other_bare == [], other_bare
    assert other_said == ""
    assert (tmp_path / "run" / "train.log").read_text().count("MarginalFisherLoss") == 1


@pytest.fixture
def torchruns_store(monkeypatch):
    """A store as torchrun's agent holds one for its processes, and this process made one of
    two that torchrun started: ``set(rank)`` gives it torchrun's variables for ``rank``."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def as_rank(rank: int) -> None:
        for name, value in {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
                            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(store.port),
                            "TORCHELASTIC_USE_AGENT_STORE": "True",
                            "TORCHELASTIC_RESTART_COUNT": "0"}.items():
            monkeypatch.setenv(name, value)

    return store, as_rank


# Commands every process of a torchrun job stops on alike, before any process group exists:
# a command that refuses torchrun, a usage error, a setting of the wrong type.
STOPPED_BEFORE_JOINING = [["eval", "RUN"], ["train", "jrd", "--bogus"],
                          ["train", "jrd", "--dataset", "digits", "train.epochs=abc"]]
SAID = "kdml/rank-0-has-said/0"  # distributed._store_key("rank-0-has-said")


@pytest.mark.parametrize("argv", STOPPED_BEFORE_JOINING, ids=["refused", "usage", "setting"])
def test_a_quiet_rank_stopped_before_joining_waits_for_rank_0s_line(
        torchruns_store, capsys, tmp_path, argv):
    """Rank 0 alone says these errors; the other ranks exited at once, and torchrun, which
    stops a job's other processes once one has stopped, stopped a rank 0 a moment slower
    (3 s late, in a torchrun job) before its line: the job ended with torchrun's report of
    exit codes and no word of why. Rank 1 now waits, on torchrun's store, for rank 0 to say
    it has said it."""
    import threading
    import time

    from kdml import cli

    store, as_rank = torchruns_store
    as_rank(1)
    said_at = []

    def rank_0_says_it() -> None:
        time.sleep(1.0)
        said_at.append(time.monotonic())
        store.set(SAID, "1")

    threading.Thread(target=rank_0_says_it, daemon=True).start()
    argv = [str(tmp_path) if item == "RUN" else item for item in argv]
    assert cli.main(argv) == 2
    returned = time.monotonic()
    assert said_at and returned >= said_at[0]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", STOPPED_BEFORE_JOINING, ids=["refused", "usage", "setting"])
def test_rank_0_stopped_before_joining_tells_the_others_it_has_said_why(
        torchruns_store, capsys, tmp_path, argv):
    store, as_rank = torchruns_store
    as_rank(0)
    from kdml import cli

    argv = [str(tmp_path) if item == "RUN" else item for item in argv]
    assert cli.main(argv) == 2
    said = capsys.readouterr().err
    assert said.startswith("kdml: error: ") and said.count("\n") == 1, said
    assert store.check([SAID])


def test_a_process_started_without_torchruns_store_stops_at_once(torchruns_store, monkeypatch,
                                                                 tmp_path):
    """Processes started by hand, or by a job script, with torchrun's variables have no store
    of torchrun's to meet at: a quiet one stops at once, as before."""
    import time

    from kdml import cli

    _, as_rank = torchruns_store
    as_rank(1)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    start = time.monotonic()
    assert cli.main(["eval", str(tmp_path)]) == 2
    assert time.monotonic() - start < 5.0


def test_an_error_rank_1_alone_meets_before_joining_is_said_by_rank_1(torchruns_store,
                                                                      monkeypatch, capsys):
    """Rank 1's config alone misspelt a key (another config file on its machine): it stopped
    quietly, waiting for rank 0 to say the error, which rank 0, waiting for rank 1 to join,
    never met; torchrun then stopped rank 0, and the job ended after 30 s with no word of
    why. Rank 1 says it itself once the wait runs out."""
    from kdml import cli

    _, as_rank = torchruns_store
    as_rank(1)
    monkeypatch.setattr(distributed, "MAIN_SAYS_WITHIN_S", 0.2)
    assert cli.main(["train", "jrd", "--dataset", "digits", "train.epochz=3"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("kdml: error: rank 1: unknown config key 'train.epochz'"), said
    assert said.count("\n") == 1, said
