"""What ``kdml``'s entry point and its commands print and return: the metrics table, the exit
status and the one line of each kind of stop or error, and the overrides it takes."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from kdml import cli


def command_raising(error: BaseException):
    def command(*args, **kwargs):
        raise error
    return command


# ----------------------------------------------------------------------------- the table


def test_the_metrics_table_is_its_header_rows_rounded_to_4_places_and_the_run_folder(
        capsys, tmp_path):
    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("amsoftmax")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, {},
                            ["data.dataset=digits"])
    cli.output._print_results(config, {"recall@1": 0.123456, "map@r": 0.99995}, tmp_path)
    assert capsys.readouterr().out == (
        "\nTest metrics (amsoftmax, digits):\n"
        "  metric       value\n"
        "  recall@1     0.1235\n"
        "  map@r        1.0000\n"
        f"run folder: {tmp_path}\n")


# ----------------------------------------------------------------------------- stops


@pytest.mark.parametrize(("stop", "code", "said"), [
    (KeyboardInterrupt(), 130, "kdml: interrupted\n"),
    (cli.Terminated(), 143, "kdml: terminated\n"),
])
def test_an_error_raised_over_a_stop_is_that_stop(monkeypatch, capsys, stop, code, said):
    """torch raises its own RuntimeError over a kill or Ctrl-C ("DataLoader worker ... is
    killed by signal"): the command ends as the stop does, not with a traceback."""
    def command(args):
        try:
            raise stop
        except KeyboardInterrupt:
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal") from None

    def command_with_cause(args):
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal") from stop

    for raising in (command, command_with_cause):
        monkeypatch.setitem(cli._COMMANDS, "recipes", raising)
        assert cli.main(["recipes"]) == code
        assert capsys.readouterr().err == said


def test_a_runtime_error_over_no_stop_keeps_its_traceback(monkeypatch):
    monkeypatch.setitem(cli._COMMANDS, "recipes", command_raising(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["recipes"])


# ----------------------------------------------------------------------------- OS errors


def test_a_pipe_whose_reader_is_gone_is_one_line(monkeypatch, capsys):
    """A printed line's write to a reader that is gone (EPIPE names no file)."""
    monkeypatch.setitem(cli._COMMANDS, "recipes",
                        command_raising(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert cli.main(["recipes"]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: the output could not be written (Broken pipe); free space where it "
        "goes, or send it elsewhere\n")


def test_an_os_error_that_names_no_file_and_is_no_full_output_keeps_its_traceback(
        monkeypatch):
    monkeypatch.setitem(cli._COMMANDS, "recipes",
                        command_raising(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError, match="Input/output error"):
        cli.main(["recipes"])


def test_an_os_error_of_two_paths_names_both(monkeypatch, capsys, tmp_path):
    """A rename refused (a folder where the file goes) names where from and where to."""
    error = IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR),
                              str(tmp_path / "a.tmp"), None, str(tmp_path / "a"))
    monkeypatch.setitem(cli._COMMANDS, "recipes", command_raising(error))
    assert cli.main(["recipes"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: {tmp_path / 'a.tmp'} -> {tmp_path / 'a'}: {os.strerror(errno.EISDIR)}; "
        "move what is in the way or choose another path\n")


@pytest.mark.parametrize(("error", "advice"), [
    (PermissionError(errno.EACCES, "Permission denied", "/x/y"), "check its permissions"),
    (OSError(errno.ENOSPC, "No space left on device", "/x/y"),
     "free space on its disk and run the command again"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/x/y"),
     "free space on its disk and run the command again"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/x/y"),
     "move what is in the way or choose another path"),
    (OSError(errno.EROFS, "Read-only file system", "/x/y"), "fix it or choose another path"),
])
def test_an_os_error_of_a_path_advises_by_its_kind(monkeypatch, capsys, error, advice):
    monkeypatch.setitem(cli._COMMANDS, "recipes", command_raising(error))
    assert cli.main(["recipes"]) == 2
    assert capsys.readouterr().err == f"kdml: error: /x/y: {error.strerror}; {advice}\n"


@pytest.mark.parametrize(("argv", "kept"), [
    (["train", "jrd"], " (a stopped run continues with kdml train --resume)"),
    (["reproduce", "jrd"], " (it keeps its finished runs and continues)"),
    (["recipes"], ""),
])
def test_a_full_disk_says_what_a_stopped_command_keeps(monkeypatch, capsys, argv, kept):
    """A full disk under kdml train or reproduce says how the same work continues; a command
    that keeps nothing says nothing more."""
    error = OSError(errno.ENOSPC, "No space left on device", "/x/y")
    monkeypatch.setitem(cli._COMMANDS, argv[0], command_raising(error))
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (f"kdml: error: /x/y: {error.strerror}; free space on "
                                       f"its disk and run the command again{kept}\n")


def test_a_quiet_exit_is_a_failure_that_prints_nothing(monkeypatch, capsys):
    """QuietExit: another process (rank 0) reported the failure; this one exits 2, as any
    refusal does, without a word of its own."""
    monkeypatch.setitem(cli._COMMANDS, "recipes", command_raising(cli.QuietExit("said")))
    assert cli.main(["recipes"]) == 2
    assert capsys.readouterr() == ("", "")


# ----------------------------------------------------------------------------- streams


def test_the_first_and_last_byte_that_is_not_utf8_are_written_as_hex():
    import codecs

    from kdml.cli import ESCAPED_BYTES, _escaped_bytes

    codecs.register_error(ESCAPED_BYTES, _escaped_bytes)
    name = os.fsdecode(b"a\x80b\xffc")
    assert name.encode("utf-8", ESCAPED_BYTES) == b"a\\x80b\\xffc"


# ----------------------------------------------------------------------------- overrides


@pytest.mark.parametrize("command", [["train", "amsoftmax"], ["config", "amsoftmax"]])
def test_an_unknown_option_among_the_overrides_is_named_as_such(capsys, command, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*command, "train.epochs=2", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == f"kdml: error: unrecognized arguments: --bogus (see 'kdml {command[0]} --help')\n"
    assert os.listdir(tmp_path) == []


def test_kdml_config_takes_overrides_after_its_options_and_the_last_one_wins(tmp_path, capsys):
    """``kdml config RECIPE --config FILE key=value`` (argparse leaves the override over), and
    of one key given twice the later value, as for any command line option."""
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("recipe: amsoftmax\n")
    assert cli.main(["config", "amsoftmax", "--config", str(config_file),
                     "train.epochs=3"]) == 0
    assert "  epochs: 3\n" in capsys.readouterr().out
    assert cli.main(["config", "amsoftmax", "train.epochs=2", "--config", str(config_file),
                     "train.epochs=5"]) == 0
    assert "  epochs: 5\n" in capsys.readouterr().out
    # the file names the recipe: argparse's "recipe" is the first override
    assert cli.main(["config", "--config", str(config_file), "train.epochs=2",
                     "train.epochs=6"]) == 0
    assert "  epochs: 6\n" in capsys.readouterr().out


# ----------------------------------------------------------------------------- train's flags


@pytest.fixture
def trained_configs(monkeypatch):
    """The configs ``kdml train`` hands to training (which returns at once)."""
    from kdml.training import trainer

    seen = []

    def train(config, run_dir, resume=False, progress=None, **_):
        seen.append(config)
        return {"recall@1": 0.5}

    monkeypatch.setattr(trainer, "train", train)
    return seen


def test_train_s_flags_reach_the_config_whatever_their_value(tmp_path, capsys, trained_configs,
                                                            monkeypatch):
    """--seed 0 wins over the config file's seed, and paths holding YAML's comment and mapping
    marks (" #", ": ") or quotes reach the config as written."""
    monkeypatch.chdir(tmp_path)
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("recipe: amsoftmax\ntrain:\n  seed: 5\n")
    root, weights = tmp_path / "my #1: data", "'w #2: x.pth'"  # a file named in quotes
    assert cli.main(["train", "--config", str(config_file), "--dataset", "cub",
                     "--data-root", str(root), "--weights", weights, "--seed", "0",
                     "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    (config,) = trained_configs
    assert (config.train.seed, config.data.root, config.model.weights) == (
        0, str(root), str(tmp_path / weights))
    assert "Test metrics (amsoftmax, cub):" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [["--seed", "0"], ["--out", "elsewhere"], ["--device", "cpu"],
                                  ["--dataset", "digits"], ["--weights", "w.pth"],
                                  ["train.epochs=3"], ["amsoftmax", "--resume"]])
def test_resume_refuses_any_flag_of_a_new_run(tmp_path, capsys, flag, trained_configs):
    """A resumed run keeps its own config: a flag, an override or a recipe given with --resume
    (even --seed 0) would be ignored without a word."""
    if flag[-1] == "--resume":  # the recipe comes first
        args = ["train", *flag, str(tmp_path)]
    else:
        args = ["train", "--resume", str(tmp_path), *flag]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: --resume takes only the run folder") and \
        err.count("\n") == 1
    assert trained_configs == []


def test_a_refused_run_leaves_the_users_own_empty_out_folder(tmp_path, capsys, monkeypatch):
    """Only a folder kdml made for a run (no --out) goes with its refused run."""
    from kdml.errors import KdmlError
    from kdml.training import trainer

    monkeypatch.setattr(trainer, "train", command_raising(KdmlError("refused by its checks")))
    out = tmp_path / "mine"
    out.mkdir()
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress"]) == 2
    assert capsys.readouterr().err == "kdml: error: refused by its checks\n"
    assert out.is_dir()


# ----------------------------------------------------------------------------- grids


def grid_args(tmp_path) -> list[str]:
    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: amsoftmax\ndata:\n  dataset: digits\ngrid:\n  train.seed: [0, 1]\n")
    return ["train", "--config", str(grid), "--out", str(tmp_path / "g"), "--no-progress"]


@pytest.mark.parametrize(("stop", "code", "word"), [(KeyboardInterrupt(), 130, "interrupted"),
                                                    (cli.Terminated(), 143, "terminated")])
def test_a_grid_stopped_in_a_cell_says_how_to_continue(tmp_path, capsys, monkeypatch, stop,
                                                       code, word):
    from kdml.training import trainer

    monkeypatch.setattr(trainer, "train", command_raising(stop))
    assert cli.main(grid_args(tmp_path)) == code
    assert capsys.readouterr().err == (
        f"kdml: {word} in cell seed=0; continue with the same command and --out "
        f"{tmp_path / 'g'}\n")


def test_a_grid_cell_failing_after_others_trained_says_they_are_kept(tmp_path, capsys,
                                                                     monkeypatch):
    from kdml.errors import KdmlError
    from kdml.training import trainer
    from kdml.training.run_folder import RunFolder

    def train(config, run_dir, resume=False, progress=None, **_):
        if config.train.seed == 1:  # refused before it wrote anything
            raise KdmlError("a bad cell")
        RunFolder(run_dir).write_metrics([{"epoch": 1, "test/recall@1": 0.5}],
                                         {"recall@1": 0.5})
        return {"recall@1": 0.5}

    monkeypatch.setattr(trainer, "train", train)
    assert cli.main(grid_args(tmp_path)) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: grid cell seed=1 failed: a bad cell -- the cell before it is kept "
        f"in {tmp_path / 'g'}: the same command continues there")


def test_the_first_grid_cell_failing_after_it_trained_says_its_own_work_is_kept(
        tmp_path, capsys, monkeypatch):
    """It had said "the 0 cells before it are kept": what the first cell trained is."""
    from kdml.errors import KdmlError
    from kdml.training import trainer
    from kdml.training.run_folder import RunFolder

    def train(config, run_dir, resume=False, progress=None, **_):
        RunFolder(run_dir).config.parent.mkdir(parents=True)
        RunFolder(run_dir).config.write_text("recipe: amsoftmax\n")  # it had begun
        raise KdmlError("a bad epoch")

    monkeypatch.setattr(trainer, "train", train)
    assert cli.main(grid_args(tmp_path)) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: grid cell seed=0 failed: a bad epoch -- what it trained is kept in "
        f"{tmp_path / 'g'}: the same command continues there")


# ----------------------------------------------------------------------------- torchrun ranks


@pytest.mark.parametrize(("stop", "code"), [(KeyboardInterrupt(), 130),
                                            (cli.Terminated(), 143)])
def test_a_stopped_rank_other_than_0_exits_with_the_stop_s_code_and_says_nothing(
        tmp_path, capsys, monkeypatch, stop, code):
    """Rank 0 alone says how to continue; every rank's exit status is the stop's."""
    from kdml import distributed

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(rank=1, size=2))

    def run():
        raise stop

    assert cli.train._run_training(run, None, tmp_path) == code
    assert capsys.readouterr() == ("", "")


def test_a_grid_cell_trained_with_other_settings_is_refused_before_any_cell_trains(
        tmp_path, capsys, monkeypatch):
    import yaml

    from kdml.training import trainer

    trained = []

    def train(config, run_dir, resume=False, progress=None, **_):
        trained.append(config.train.seed)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        return {"recall@1": 0.5}

    monkeypatch.setattr(trainer, "train", train)
    args = grid_args(tmp_path)
    assert cli.main(args) == 0 and trained == [0, 1]
    capsys.readouterr()
    assert cli.main([*args, "train.epochs=7"]) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: grid cell seed=0 in {tmp_path / 'g'} was trained with other settings "
        "(train.epochs: ")
    assert trained == [0, 1]


def test_a_flag_is_refused_with_a_grid_over_its_key_by_its_leaf_name(tmp_path, capsys,
                                                                     trained_configs):
    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: amsoftmax\ndata:\n  dataset: digits\ngrid:\n  seed: [0, 1]\n")
    assert cli.main(["train", "--config", str(grid), "--seed", "5", "--out",
                     str(tmp_path / "g")]) == 2
    assert capsys.readouterr().err == (
        "kdml: error: --seed sets train.seed, over which the config's grid runs; give one\n")
    assert trained_configs == []


def test_a_domain_pair_cut_by_the_shell_s_redirection_is_named(tmp_path, capsys):
    """Unquoted, 'mnist5k->digits' reaches kdml as 'mnist5k-' (the shell took '>')."""
    assert cli.main(["train", "amsoftmax", "--dataset", "mnist5k-", "--out",
                     str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: unknown dataset 'mnist5k-'; choose one of: ")
    assert err.endswith(" (quote domain pairs in the shell: --dataset 'mnist5k->digits')\n")
    assert cli.main(["train", "amsoftmax", "--dataset", "mnist5k>", "--out",
                     str(tmp_path / "run")]) == 2
    assert "quote" not in capsys.readouterr().err


def test_a_grid_continues_its_started_cell_and_starts_the_others(tmp_path, capsys, monkeypatch):
    import yaml

    from kdml.training import trainer

    calls = []

    def stopped_in_its_first_cell(config, run_dir, resume=False, progress=None, **_):
        calls.append((config.train.seed, resume))
        run_dir.mkdir(parents=True, exist_ok=True)  # started, not finished
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        if len(calls) == 1:
            raise KeyboardInterrupt
        return {"recall@1": 0.5}

    monkeypatch.setattr(trainer, "train", stopped_in_its_first_cell)
    args = grid_args(tmp_path)
    assert cli.main(args) == 130
    capsys.readouterr()
    assert cli.main(args) == 0
    assert calls == [(0, False), (0, True), (1, False)]
    out, folder = capsys.readouterr().out, tmp_path / "g"
    assert out.startswith(f"grid of 2 runs of amsoftmax on digits into {folder}\n"
                          "[1/2] seed=0\n[2/2] seed=1\n\nTest metrics per cell (amsoftmax, "
                          "digits):\n")
    assert out.endswith(f"\ngrid folder: {folder}\n")


# ----------------------------------------------------------------------------- datasets


def test_kdml_datasets_names_the_folder_training_would_read(tmp_path, monkeypatch, capsys):
    from kdml.data.registry import FORMATS, ROOT_VARIABLE, find_root

    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    for folder in ("CUB_200_2011", "cub"):  # two complete copies (but for the images)
        (tmp_path / folder / "images").mkdir(parents=True)
        for name in ("images.txt", "image_class_labels.txt"):
            (tmp_path / folder / name).write_text("")
    read = find_root(FORMATS["cub"])
    assert cli.main(["datasets"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines()
               if line.split()[0] == "cub" and "found in" in line]
    assert line.endswith(f"; found in {read}")


# ----------------------------------------------------------------------------- eval


def amsoftmax_on_digits():
    from kdml.config import resolve_config
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("amsoftmax")
    return resolve_config(recipe.name, recipe.params, recipe.defaults, {},
                          ["data.dataset=digits"])


@pytest.mark.parametrize("skipped", [False, True])
def test_eval_prints_the_test_set_again_once_scoring_found_unreadable_images(
        monkeypatch, capsys, tmp_path, skipped):
    """Only decoding finds an unreadable image: the "test set" line is said again with the
    samples the metrics are of; the metrics returned are the scorer's (eval.json's, and those
    printed)."""
    from types import SimpleNamespace

    import kdml.evaluation.evaluator as evaluator

    splits = SimpleNamespace(test_set="10 samples", unreadable=[])

    def score(method, scored, eval_config, embedder):
        if skipped:
            scored.test_set, scored.unreadable = "9 samples (1 left out)", ["x.png"]
        return SimpleNamespace(recorded=lambda: {"recall@1": 0.123456})

    monkeypatch.setattr(evaluator, "score_method", score)
    trained = SimpleNamespace(epoch=3, method=None, run=SimpleNamespace(root=tmp_path))
    metrics = cli.evaluate._score(trained, amsoftmax_on_digits(), splits, None, True)
    assert metrics == {"recall@1": 0.123456}
    again = "test set: 9 samples (1 left out)\n" if skipped else ""
    assert capsys.readouterr().out == (
        f"best checkpoint: epoch 3\ntest set: 10 samples\n{again}")


# ----------------------------------------------------------------------------- analyze


@pytest.mark.parametrize(("unfitted", "validation"), [(0.0, 0.0), (0.125, 0.0), (0.0, 0.4)])
def test_analyze_prints_its_terms_and_notes_unfitted_classes_only_where_there_are_some(
        monkeypatch, capsys, tmp_path, unfitted, validation):
    from types import SimpleNamespace

    import kdml.inspection.analysis as analysis
    import kdml.training.loading as loading
    from kdml.evaluation.estimate import Estimate

    trained = SimpleNamespace(splits=SimpleNamespace(train=[0] * 100, test=[0] * 1200,
                                                     validation=validation,
                                                     test_parts=[SimpleNamespace(labels=torch.zeros(1200))]),
                              method=SimpleNamespace(has_charts=False))
    terms = {name: Estimate(value, 0.01, (value,)) for name, value in (
        ("h_divergence", 0.61234), ("h_divergence_bd", 0.2), ("lambda", 0.3),
        ("err_seen", 0.1), ("err_unseen", 0.2), ("unfitted", unfitted))}
    monkeypatch.setattr(loading, "load_run", lambda *args, **kwargs: trained)
    monkeypatch.setattr(analysis, "check_unseen_classes", lambda run_dir: None)  # no folder
    monkeypatch.setattr(analysis, "analyze_generalization",
                        lambda run, settings: (terms, tmp_path / "generalization.json"))
    assert cli.main(["analyze", "generalization", str(tmp_path), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "  H-divergence d_H   0.6123 +- 0.0100\n" in out
    assert out.endswith(f"written to {tmp_path / 'generalization.json'}\n")
    validated = ("kdml: note: this run validated (data.validation): its unseen classes here are "
                 "the validation part (1,200 samples of the classes held out of its training "
                 "classes to choose its epoch); the test part is not used\n")
    assert err == ("" if not (unfitted or validation) else validated if validation else
                   "kdml: note: 12.5% of the scored samples are of classes with no sample in the "
                   "fitted part; lambda counts them as errors: raise --labelled-fraction\n")


# ----------------------------------------------------------------------------- search


def test_the_search_table_pads_short_and_full_width_class_names_and_rounds_to_4_places(
        monkeypatch, capsys, tmp_path):
    """The class column is at least as wide as its header ("class"); a full-width letter
    (East Asian width F, as Ａ) takes two columns."""
    from kdml.inspection import search

    neighbours = [{"rank": rank, "score": score, "label": rank, "class_name": name,
                   "source": f"img{rank}.jpg"}
                  for rank, (name, score) in enumerate((("cat", 0.123456), ("ＡＢ", 2.0)), 1)]
    monkeypatch.setattr(search, "run_without_data", lambda *args: None)
    monkeypatch.setattr(search, "search", lambda *args: [
        {"query": "q.jpg", "metric": "euclidean", "neighbours": neighbours}])
    assert cli.main(["search", str(tmp_path), "--index", "index", "--query", "q.jpg",
                     "-k", "2"]) == 0  # the run folder is there; what is read of it stubbed
    assert capsys.readouterr().out.splitlines() == [
        "query q.jpg:",
        "  rank    distance   label  class  source",
        "     1      0.1235       1  cat    img1.jpg",
        "     2      2.0000       2  ＡＢ   img2.jpg"]


def test_the_search_table_keeps_4_significant_digits_of_small_distances(monkeypatch, capsys,
                                                                         tmp_path):
    """An Atlas run's chart coordinates may spread over 1e-3 (near its initialisation): a
    distance of 2.7e-4 printed as 0.0003, beside another of 2.6e-4, and one of 4e-5 as 0.0000,
    the query's own distance. Distances below 0.1 keep 4 significant digits (below 1e-5 in
    scientific notation, within the column); similarities and larger distances keep 4 places."""
    from kdml.inspection import search

    def neighbours(scores: tuple[float, ...]) -> list[dict[str, object]]:
        return [{"rank": rank, "score": score, "label": 0, "source": f"img{rank}.jpg"}
                for rank, score in enumerate(scores, 1)]

    monkeypatch.setattr(search, "run_without_data", lambda *args: None)
    monkeypatch.setattr(search, "search", lambda *args: [
        {"query": "q.npz[0]", "metric": "euclidean",
         "neighbours": neighbours((0.0, 4e-5, 2.651690e-4, 2.705350e-4, 0.0123456, 3e-7))},
        {"query": "q.npz[1]", "metric": "cosine", "neighbours": neighbours((0.99999, 4e-5))}])
    assert cli.main(["search", str(tmp_path), "--index", "index", "--query", "q.npz",
                     "-k", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[2:8]] == [
        "0.0000", "0.00004000", "0.0002652", "0.0002705", "0.01235", "3.000e-07"]
    assert [line.split()[1] for line in lines[10:]] == ["1.0000", "0.0000"]
    assert all(line.index("  0  ") == lines[2].index("  0  ") for line in lines[2:8])


@pytest.mark.parametrize("grid", [False, True])
def test_an_out_inside_the_image_folder_is_refused_for_a_run_and_a_grid(tmp_path, capsys,
                                                                       trained_configs, grid):
    images = tmp_path / "photos"
    images.mkdir()
    out = images / "run"
    if grid:
        file = tmp_path / "grid.yaml"
        file.write_text(f"recipe: amsoftmax\ndata:\n  dataset: folder:{images}\n"
                        "grid:\n  train.seed: [0, 1]\n")
        args = ["train", "--config", str(file)]
    else:
        args = ["train", "amsoftmax", "--dataset", f"folder:{images}"]
    assert cli.main([*args, "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: the run folder {out} would lie inside {images}, the image folder of "
        f"--dataset folder:{images}: its plots would be read as images of a class the next "
        "time; give --out a folder outside it\n")
    assert trained_configs == [] and list(images.iterdir()) == []


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGPIPE"), reason="no SIGPIPE")
def test_the_console_command_ends_quietly_when_its_reader_is_gone():
    """`kdml recipes | head -0`: no error line, no traceback (SIGPIPE's default)."""
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "kdml", "recipes"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before anything is written
    err = process.stderr.read()
    assert process.wait(timeout=120) == -signal.SIGPIPE and err == b""


def test_embed_says_how_many_embeddings_of_which_size_it_wrote(monkeypatch, capsys, tmp_path):
    import numpy as np

    import kdml.inspection.parts as parts

    arrays = {"labels": np.zeros(5, dtype=np.int64), "embeddings": np.zeros((5, 3))}
    monkeypatch.setattr(cli.evaluate, "_run_and_part", lambda args: (None, None))
    monkeypatch.setattr(parts, "embed_part", lambda trained, part: arrays)
    monkeypatch.setattr(parts, "write_npz", lambda path, written: path)
    out = tmp_path / "e.npz"
    assert cli.main(["embed", str(tmp_path), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"5 embeddings of size 3 written to {out}\n"


@pytest.mark.parametrize("command", [["eval"], ["embed", "--out", "{tmp}/e.npz"],
                                     ["index", "--out", "{tmp}/index"]])
@pytest.mark.parametrize("best", [False, True])
def test_another_dataset_is_scored_by_the_checkpoint_asked_for(monkeypatch, capsys, tmp_path,
                                                               command, best):
    """--best with --dataset loads best.pt, without it last.pt (each command, as for the
    run's own data)."""
    import kdml.training.loading as loading
    from kdml.errors import KdmlError

    def load_model(run_dir, best=False, **kwargs):
        raise KdmlError(f"loaded with best={best}")

    monkeypatch.setattr(loading, "load_model", load_model)
    name, *options = command
    args = [name, str(tmp_path), "--dataset", "digits",
            *(option.format(tmp=tmp_path) for option in options), *(["--best"] * best)]
    assert cli.main(args) == 2
    assert capsys.readouterr().err == f"kdml: error: loaded with best={best}\n"


def test_index_says_what_it_wrote(monkeypatch, capsys, tmp_path):
    import kdml.inspection.parts as parts
    from kdml.evaluation.index import IndexInfo

    info = IndexInfo("run", "0", "euclidean", 16, "hnsw", 900, 1.0, None)
    monkeypatch.setattr(cli.evaluate, "_run_and_part", lambda args: (None, None))
    monkeypatch.setattr(parts, "index_part", lambda *args: info)
    out = tmp_path / "index"
    assert cli.main(["index", str(tmp_path), "--out", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"hnsw euclidean index of 900 16-d vectors written to {out}\n")


@pytest.mark.parametrize("started", [False, True])
def test_a_run_stopped_says_how_to_continue_or_that_nothing_was_written(tmp_path, capsys,
                                                                        started):
    if started:
        (tmp_path / "config.yaml").write_text("recipe: amsoftmax\n")

    def run():
        raise KeyboardInterrupt

    assert cli.train._run_training(run, None, tmp_path) == 130
    assert capsys.readouterr() == ("", (
        f"kdml: interrupted; continue with: kdml train --resume {tmp_path}\n" if started else
        "kdml: interrupted before training started; nothing was written\n"))


def test_kdml_datasets_names_an_incomplete_copy_that_training_would_read(tmp_path, monkeypatch,
                                                                          capsys):
    """An incomplete copy under $KDML_DATA_ROOT is what training reads (find_root), not the
    system folder's complete one, which the listing had named as where the dataset is found."""
    import dataclasses

    from kdml.data import registry

    system = tmp_path / "system"
    entry = dataclasses.replace(registry.FORMATS["fashion-mnist"], system_root=str(system))
    monkeypatch.setitem(registry.FORMATS, "fashion-mnist", entry)
    system.mkdir()
    for need in entry.needs:  # a complete copy: every file, under the first of its names
        (system / need.split("|")[0]).write_text("")
    (tmp_path / "mine" / "fashion-mnist").mkdir(parents=True)
    monkeypatch.delenv(registry.ROOT_VARIABLE, raising=False)
    assert cli.main(["datasets"]) == 0
    assert f"; found in {system}\n" in capsys.readouterr().out
    monkeypatch.setenv(registry.ROOT_VARIABLE, str(tmp_path / "mine"))
    assert registry.find_root(entry) == tmp_path / "mine" / "fashion-mnist"
    assert cli.main(["datasets"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines()
               if line.split()[0] == "fashion-mnist"]
    assert line.endswith(f"; not complete in {tmp_path / 'mine' / 'fashion-mnist'}, which "
                         "training reads (missing train-images-idx3-ubyte, "
                         "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                         "t10k-labels-idx1-ubyte)")


@pytest.mark.parametrize("score", [None, "0.5", True])
def test_a_finished_cell_whose_score_is_no_number_shows_a_dash(tmp_path, capsys, monkeypatch,
                                                               score):
    """A metrics.json rewritten by another tool (jq writes kdml's NaN as null) had stopped the
    grid's table with a TypeError or ValueError traceback; NaN itself prints as nan."""
    import json

    import yaml

    from kdml.training import trainer

    def trained(config, run_dir, resume=False, progress=None, **_):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        final = {"recall@1": 0.5 if config.train.seed else float("nan")}
        (run_dir / "metrics.json").write_text(json.dumps({"epochs": [], "final": final}))
        return final

    monkeypatch.setattr(trainer, "train", trained)
    def table() -> dict[str, list[str]]:
        return {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()
                if line.startswith("  seed=")}

    args = grid_args(tmp_path)
    capsys.readouterr()
    assert cli.main(args) == 0
    assert table() == {"seed=0": ["nan"], "seed=1": ["0.5000"]}
    first = tmp_path / "g" / "seed=0" / "metrics.json"
    first.write_text(json.dumps({"epochs": [], "final": {"recall@1": score}}))
    assert cli.main(args) == 0
    assert table() == {"seed=0": ["-"], "seed=1": ["0.5000"]}


@pytest.mark.parametrize(("name", "files", "missing"), [
    ("cub", ["images.txt"], "image_class_labels.txt, images/"),
    ("mnist", ["train-images-idx3-ubyte.gz", "train-labels.idx1-ubyte"],
     "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte"),
    ("inshop", ["Eval/list_eval_partition.txt", "Img/img/x.jpg"], "img/"),
    ("cifar10", ["data_batch_1", "test_batch"], "data_batch_2, data_batch_3, data_batch_4, "
                                                "data_batch_5"),
    # there as the other kind: had been called missing as if nothing were there
    ("cub", ["images.txt", "image_class_labels.txt/x", "images"],
     "image_class_labels.txt (is not a file), images/ (is not a folder)"),
])
def test_kdml_datasets_names_what_a_copy_with_a_marker_file_lacks(tmp_path, monkeypatch, capsys,
                                                                  name, files, missing):
    """README: kdml datasets says a copy under $KDML_DATA_ROOT that lacks files is not
    complete. One holding the dataset's marker file (CUB's images.txt, MNIST's train labels)
    had been listed as "found in", and training then stopped on the files missing beside it;
    the line names them (any of a file's names will do: MNIST's gzipped or dotted ones), and
    says which of them are there as the other kind (a folder where a file is needed)."""
    from kdml.data import registry

    for file in files:
        path = tmp_path / name / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    monkeypatch.setenv(registry.ROOT_VARIABLE, str(tmp_path))
    assert cli.main(["datasets"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines()
               if line.split() and line.split()[0] == name]
    assert line.endswith(f"; not complete in {tmp_path / name}, which training reads (missing "
                         f"{missing})")


def test_every_on_disk_formats_needs_hold_its_markers():
    """kdml datasets calls a copy complete when nothing of a format's needs is missing: a
    marker that is no need would let a folder without it pass as complete."""
    from kdml.data import registry

    for entry in registry.FORMATS.values():
        alternatives = {name for need in entry.needs for name in need.split("|")}
        assert set(entry.markers) <= alternatives, entry.name


def test_a_ctrl_c_that_fails_a_reading_command_s_import_is_a_stop(monkeypatch, capsys):
    """A command's lazy import of a C extension that a Ctrl-C interrupts fails with an
    ImportError over the KeyboardInterrupt (pybind11's "initialization failed"): one line and
    130, as any Ctrl-C, not a traceback; an ImportError of its own is still a bug's traceback."""
    from kdml import cli

    def interrupted_import(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as stop:
            raise ImportError("initialization failed") from stop

    monkeypatch.setitem(cli._COMMANDS, "recipes", interrupted_import)
    assert cli.main(["recipes"]) == 130
    assert capsys.readouterr().err == "kdml: interrupted\n"

    def broken_import(args):
        raise ImportError("cannot import name 'x'")

    monkeypatch.setitem(cli._COMMANDS, "recipes", broken_import)
    with pytest.raises(ImportError, match="cannot import name"):
        cli.main(["recipes"])
