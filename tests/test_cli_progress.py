"""Every command that embeds a trained run's data takes --no-progress, as train and reproduce
do: on a terminal, embedding SOP's 60,502 test images draws a bar for minutes."""

from __future__ import annotations

import pytest
from tqdm.auto import tqdm

from kdml import cli
from kdml.evaluation import evaluator

COMMANDS = {
    "eval": ["eval", "{run}"],
    "eval --dataset": ["eval", "{run}", "--dataset", "digits"],
    "embed": ["embed", "{run}", "--out", "{tmp}/emb.npz"],
    "embed --dataset": ["embed", "{run}", "--dataset", "digits", "--out", "{tmp}/other.npz"],
    "index": ["index", "{run}", "--out", "{tmp}/index"],
    "analyze generalization": ["analyze", "generalization", "{run}", "--repeats", "2"],
    "plot retrieval": ["plot", "retrieval", "{run}", "--queries", "2", "-k", "2"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_the_embedding_bar_follows_no_progress(command, trained_run, tmp_path, monkeypatch):
    """Without the flag the bar keeps tqdm's rule (``disable=None``: a terminal only); with
    it, every bar of the command is off."""
    disabled: list[bool | None] = []

    def recording_tqdm(*args, **kwargs):
        disabled.append(kwargs.get("disable"))
        return tqdm(*args, **kwargs)

    monkeypatch.setattr(evaluator, "tqdm", recording_tqdm)
    for flags, expected in (([], None), (["--no-progress"], True)):
        out = tmp_path / ("quiet" if flags else "default")
        out.mkdir()
        disabled.clear()
        words = [word.format(run=trained_run, tmp=out) for word in COMMANDS[command]]
        assert cli.main([*words, *flags]) == 0
        assert disabled and set(disabled) == {expected}
