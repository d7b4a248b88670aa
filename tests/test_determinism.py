"""train.deterministic: torch's deterministic flags set while a run trains, restored after."""

from __future__ import annotations

import pytest
import torch

from kdml import cli
from kdml.training.determinism import deterministic_mode


def _flags() -> tuple[bool, bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic)


@pytest.fixture(autouse=True)
def _restore_flags():
    """Each test leaves torch's flags as it found them, whatever it asserts."""
    algorithms, benchmark, cudnn_deterministic = _flags()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = cudnn_deterministic


@pytest.mark.parametrize("benchmark", [False, True])
def test_the_block_is_deterministic_and_the_flags_before_come_back(benchmark):
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, False
    with deterministic_mode(True):
        assert _flags() == (True, False, True)
    assert _flags() == (False, benchmark, False)
    with pytest.raises(RuntimeError, match="inside"), deterministic_mode(True):
        raise RuntimeError("inside")
    assert _flags() == (False, benchmark, False)  # restored after an error too
    with deterministic_mode(False):
        assert _flags() == (False, benchmark, False)  # off: the flags are left alone


def test_a_deterministic_run_trains_so_and_the_process_gets_its_flags_back(
        tmp_path, tiny_overrides, modes_while_training):
    torch.use_deterministic_algorithms(False)
    before = _flags()
    seen = modes_while_training(_flags)
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(tmp_path / "run"),
                     *tiny_overrides, "train.epochs=1", "--no-progress",
                     "train.deterministic=true"]) == 0
    assert seen == [(True, False, True)]
    assert _flags() == before
