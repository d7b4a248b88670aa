"""Every command that embeds a trained run's data takes --no-progress, as train and reproduce
do: on a terminal, embedding SOP's 60,502 test images draws a bar for minutes. And what the
bars show on a terminal, with the lines written among them."""

from __future__ import annotations

import io

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


def _bar_lines(text: str) -> list[str]:
    """What a terminal keeps of ``text`` written with progress bars: of each line, the part
    after its last carriage return (a bar redraws its line from there)."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


@pytest.mark.parametrize("stop", ["train.tolerance=1e9", "train.patience=1"])
def test_a_run_stopped_early_counts_its_last_epoch_and_says_why_below_its_bar(
        stop, tmp_path, monkeypatch):
    """A run stopped early (train.tolerance after epoch 2 of 3; train.patience, whose
    validation score of epoch 2 cannot beat epoch 1's on a metric that is constant here) had
    left its epochs bar at "1/3": a bar iterated over the epochs counts one only as the next
    begins. And the line saying why it stopped had been printed onto the bar's own line
    ("...recall@1=0.739]stopped after epoch 2 of 3: ..."), the bar still drawn there."""
    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe
    from kdml.training.trainer import train

    # the terminal: the bars (stderr) and the lines printed (stdout) on one screen
    screen = io.StringIO()
    monkeypatch.setattr("sys.stdout", screen)
    monkeypatch.setattr("sys.stderr", screen)
    recipe = get_recipe("amsoftmax")
    patience = stop.startswith("train.patience")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, {}, [
        "data.dataset=digits", "train.epochs=3", "train.steps_per_epoch=2",
        "data.batch_size=20", "model.embedding_size=8", "eval.nmi=false",
        "train.device=cpu", stop,
        # a score no epoch improves on: every validation sample's Recall@500 is 1
        *(["data.validation=0.5", "eval.ks=[500]", "train.select_metric=recall@500"]
          if patience else [])])
    train(config, tmp_path / "run", progress=True)
    lines = _bar_lines(screen.getvalue())
    said = [line for line in lines if "stopped after epoch 2 of 3" in line]
    assert len(said) == 1 and said[0].startswith("stopped after epoch 2 of 3"), said
    last_bar = [line for line in lines if line.startswith("epochs:")][-1]
    assert "| 2/3 [" in last_bar, last_bar


def _screen(text: str) -> list[str]:
    """The lines a terminal shows after ``text``: each character written over what is at the
    cursor, a carriage return back to the line's start, a newline to the next line's start,
    and tqdm's cursor up (ESC [A) one line up."""
    lines, row, column, at = [""], 0, 0, 0
    while at < len(text):
        if text.startswith("\x1b[A", at):
            row, at = max(row - 1, 0), at + 3
            continue
        character, at = text[at], at + 1
        if character == "\r":
            column = 0
        elif character == "\n":
            row, column = row + 1, 0
        else:
            lines += [""] * (row + 1 - len(lines))
            line = lines[row].ljust(column)
            lines[row] = line[:column] + character + line[column + 1:]
            column += 1
    return [line.rstrip() for line in lines]


def test_a_warning_logged_while_a_bar_is_drawn_gets_a_line_of_its_own_above_it(monkeypatch):
    """A warning logged mid-epoch (an image skipped as unreadable, by a loader worker) had
    been appended to the bar's own line on the terminal ("epoch 1:  25%|...| 1/4
    [...]kdml: warning: skipping unreadable image ..."), which the bar then redrew below."""
    import logging
    import sys

    from kdml.run_log import warning_handler

    screen = io.StringIO()
    monkeypatch.setattr("sys.stderr", screen)
    log = logging.getLogger("kdml.test_progress")
    handler = warning_handler()
    log.addHandler(handler)
    try:
        with tqdm(total=4, desc="epoch 1", file=sys.stderr, disable=False, ncols=70) as bar:
            bar.update()
            log.warning("skipping unreadable image bad.png")
            bar.update()
    finally:
        log.removeHandler(handler)
    shown = [line for line in _screen(screen.getvalue()) if line]
    assert shown[0] == "kdml: warning: skipping unreadable image bad.png", shown
    assert len(shown) == 2 and shown[1].startswith("epoch 1:  50%") and "2/4" in shown[1], shown


@pytest.mark.parametrize(("term", "progress", "disabled"), [
    ("dumb", None, True), ("dumb", True, False), ("dumb", False, True),
    ("xterm-256color", None, None), (None, None, None)])
def test_a_dumb_terminal_gets_no_bars_unless_asked(term, progress, disabled, monkeypatch):
    """TERM=dumb (Emacs' shell and compile buffers) cannot move its cursor: the nested bars'
    cursor-up codes showed as "^[[A" on every redraw. Elsewhere tqdm's own rule (None: a
    terminal only) stands; True still draws them."""
    from kdml.progress import bar_disabled

    if term is None:
        monkeypatch.delenv("TERM", raising=False)
    else:
        monkeypatch.setenv("TERM", term)
    assert bar_disabled(progress) is disabled
