"""The ``kdml`` command line's parser alone: the defaults its help texts promise, the bounds of
its numeric options (both ends), and its argparse types' one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdml import cli
from kdml.cli.parser import build_parser


def parsed(*args: str):
    return build_parser().parse_args(list(args))


def help_text(capsys, monkeypatch, *command: str) -> str:
    """``kdml COMMAND --help``'s text on one line (a terminal wide enough not to wrap it)."""
    monkeypatch.setenv("COLUMNS", "1000")
    capsys.readouterr()
    assert cli.main([*command, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def refused_line(capsys, *args: str) -> str:
    """``kdml ARGS`` refused by the parser: exit status 2 and one line on stderr."""
    capsys.readouterr()
    assert cli.main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("args", "expected"), [
    (["analyze", "generalization", "RUN"],
     {"repeats": 10, "labelled_fraction": 0.5, "neighbors": 1, "seed": 0, "device": None,
      "data_root": None, "no_progress": False}),
    (["plot", "charts", "RUN"], {"thumbnails": 100, "best": False, "test": False}),
    (["plot", "retrieval", "RUN"], {"queries": 8, "k": 8, "seed": 0, "device": None}),
    (["plot", "embedding", "RUN"], {"max_points": 5000}),
    (["search", "RUN", "--index", "I", "--query", "Q"],
     {"k": 10, "json": False, "best": False, "device": None}),
    (["embed", "RUN", "--out", "E"], {"split": "test", "dataset": None, "device": None}),
    (["index", "RUN", "--out", "I"], {"split": "searched", "kind": "exact", "device": None}),
    (["eval", "RUN"], {"ks": None, "best": False, "test": False, "dataset": None,
                       "device": None}),
    (["reproduce", "jrd"], {"seeds": None, "quick": False, "device": "auto", "out": None,
                            "runs": None, "only": [], "list": False}),
    (["train", "jrd"], {"overrides": [], "seed": None, "device": None, "out": None,
                        "resume": None}),
    (["config", "jrd"], {"overrides": [], "config": None}),
])
def test_defaults_are_those_the_help_texts_promise(args, expected):
    namespace = vars(parsed(*args))
    assert {key: namespace[key] for key in expected} == expected


@pytest.mark.parametrize(("command", "option", "low", "high"), [
    (["analyze", "generalization", "RUN"], "--repeats", 2, None),
    (["analyze", "generalization", "RUN"], "--neighbors", 1, None),
    (["analyze", "generalization", "RUN"], "--seed", 0, 2**32 - 1),
    (["plot", "charts", "RUN"], "--thumbnails", 0, None),
    (["plot", "retrieval", "RUN"], "--queries", 1, 64),
    (["plot", "retrieval", "RUN"], "-k", 1, 64),
    (["plot", "retrieval", "RUN"], "--seed", 0, 2**32 - 1),
    (["plot", "embedding", "RUN"], "--max-points", 3, None),
    (["search", "RUN", "--index", "I", "--query", "Q"], "-k", 1, None),
    (["eval", "RUN"], "--ks", 1, None),
    (["reproduce", "jrd"], "--seeds", 1, 1000),
    (["train", "jrd"], "--seed", 0, 2**63 - 1),  # NumPy's and torch's seeds
])
def test_integer_options_take_both_ends_of_their_range_and_nothing_past_them(
        capsys, command, option, low, high):
    destination = option.lstrip("-").replace("-", "_")

    def value(number: int):
        got = getattr(parsed(*command, option, str(number)), destination)
        return got[0] if isinstance(got, list) else got

    assert value(low) == low
    bound = f"from {low} to {high}" if high is not None else f">= {low}"
    err = refused_line(capsys, *command, option, str(low - 1))
    assert f"{option}: must be {bound}, got {low - 1} (see 'kdml " in err, err
    if high is not None:
        assert value(high) == high
        err = refused_line(capsys, *command, option, str(high + 1))
        assert f"{option}: must be {bound}, got {high + 1}" in err, err
    else:
        assert value(low + 10**6) == low + 10**6
    assert "expected an integer, got '1.5'" in refused_line(capsys, *command, option, "1.5")


@pytest.mark.parametrize("text", ["0", "1", "0.0", "1.0", "-0.5", "nan", "inf"])
def test_a_labelled_fraction_outside_the_open_interval_is_refused(capsys, text):
    err = refused_line(capsys, "analyze", "generalization", "RUN", "--labelled-fraction", text)
    assert "--labelled-fraction: must be between 0 and 1 (exclusive)" in err, err


@pytest.mark.parametrize("text", ["1e-9", "0.999999"])
def test_a_labelled_fraction_just_inside_the_interval_is_taken(text):
    assert parsed("analyze", "generalization", "RUN", "--labelled-fraction",
                  text).labelled_fraction == float(text)


def test_a_labelled_fraction_that_is_not_a_number_is_named(capsys):
    err = refused_line(capsys, "analyze", "generalization", "RUN", "--labelled-fraction", "half")
    assert "expected a number, got 'half'" in err


@pytest.mark.parametrize("text", ["", " ", "\t"])
def test_a_blank_path_is_refused(capsys, text):
    assert "expected a path, got an empty one" in refused_line(capsys, "eval", text)


def test_paths_expand_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parsed("eval", "~/run").run_dir == tmp_path / "run"
    assert parsed("train", "jrd", "--out", "~/new").out == tmp_path / "new"


def test_a_data_root_is_made_absolute_and_a_file_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    (tmp_path / "list.csv").write_text("path,label\n")
    root = parsed("eval", "RUN", "--data-root", "images").data_root
    assert root.is_absolute() and root == tmp_path / "images"
    err = refused_line(capsys, "eval", "RUN", "--data-root", "list.csv")
    assert "list.csv is a file; give the folder the data lies in" in err


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "auto"])
def test_device_names_are_taken(device):
    assert parsed("eval", "RUN", "--device", device).device == device
    assert parsed("reproduce", "jrd", "--device", device).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:-1"])
def test_a_malformed_device_name_is_refused_in_one_line(capsys, device):
    err = refused_line(capsys, "eval", "RUN", "--device", device)
    assert "argument --device: " in err


def test_a_command_is_required_and_bad_arguments_exit_2_in_one_line(capsys):
    assert refused_line(capsys).endswith("(see 'kdml --help')\n")
    assert refused_line(capsys, "plot").endswith("(see 'kdml plot --help')\n")
    assert refused_line(capsys, "index", "RUN", "--out", "I", "--kind", "flat").count(
        "invalid choice") == 1
    assert refused_line(capsys, "eval", "RUN", "--ks").count("--ks") == 1


@pytest.mark.parametrize(("args", "expected"), [
    ([], "name a command: train, eval, analyze, plot, embed, index, search, reproduce, "
         "datasets, recipes or config (see 'kdml --help')"),
    (["plot"], "name a plot: charts, retrieval or embedding (see 'kdml plot --help')"),
    (["analyze"], "name an analysis: generalization (see 'kdml analyze --help')")])
def test_a_missing_command_names_the_commands_to_choose_from(capsys, args, expected):
    """`kdml` alone had said "the following arguments are required: command" (argparse's inner
    name of it), `kdml plot` "...: plot": not which commands there are."""
    assert refused_line(capsys, *args) == f"kdml: error: {expected}\n"


@pytest.mark.parametrize("args", [["datasets", "extra"], ["recipes", "--foo"],
                                  ["config", "amsoftmax", "--out", "run"],
                                  ["eval", "RUN", "extra"], ["plot", "retrieval", "RUN", "x"],
                                  ["analyze", "generalization", "RUN", "x"]])
def test_an_unrecognized_argument_points_at_its_command_s_help(capsys, args):
    """An argument no option takes was refused pointing at 'kdml --help', which lists the
    commands alone, not the options the command takes (`kdml config jrd --out run`: 'kdml
    config --help' says config takes no --out)."""
    command = " ".join(arg for arg in args[:2] if arg in {
        "datasets", "recipes", "config", "eval", "plot", "retrieval", "analyze",
        "generalization"})
    assert refused_line(capsys, *args).endswith(f" (see 'kdml {command} --help')\n")


def test_options_repeat_and_accumulate_where_documented():
    args = parsed("reproduce", "jrd", "--only", "a-*", "--only", "b")
    assert args.only == ["a-*", "b"]
    assert parsed("eval", "RUN", "--ks", "1", "5", "10").ks == [1, 5, 10]
    # a repeated --ks adds its values: the last alone had been scored (Recall@1 dropped)
    assert parsed("eval", "RUN", "--ks", "1", "--dataset", "d", "--ks", "5", "10").ks == [
        1, 5, 10]
    assert parsed("eval", "RUN").ks is None  # the run's eval.ks
    assert isinstance(parsed("eval", "RUN").run_dir, Path)


@pytest.mark.parametrize("plot", ["retrieval", "embedding"])
def test_a_plot_s_help_names_the_files_best_and_test_write(capsys, monkeypatch, plot):
    """`kdml plot retrieval --help` said it draws "into plots/retrieval.png", where --best
    draws plots/retrieval-best.png and --test of a run that validated retrieval-test.png
    (docs/inspecting.md), beside it."""
    text = help_text(capsys, monkeypatch, "plot", plot)
    assert (f"into plots/{plot}.png ({plot}-best.png with --best; {plot}-test.png with --test, "
            "of a run that validated)") in text


def test_kdml_eval_s_help_says_what_it_scores_and_writes(capsys, monkeypatch):
    """`kdml eval --help` had no description: not that it writes eval.json (eval-best.json,
    eval-test.json, as docs/inspecting.md names them), nor that a user's own file of that name
    is refused before scoring."""
    text = help_text(capsys, monkeypatch, "eval")
    assert ("write them to RUN/eval.json (eval-best.json with --best; eval-test.json with "
            "--test, of a run that validated). A file of that name kdml did not write is "
            "refused before scoring: move it away.") in text
