"""A run folder's config.yaml as a user edits it between runs: kdml writes it whole, after a
``config_format:`` line, so a setting deleted from it is refused (naming the line to put back),
not read as the built-in default; a file from before that line reads as it always did; an
edit ``--resume`` takes (more epochs) is honoured however an editor saved the file."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from kdml import cli, config
from kdml.config import (
    CONFIG_FORMAT,
    FORMAT_KEY,
    RunConfig,
    all_keys,
    resolve_config,
    save_config,
)
from kdml.errors import KdmlError
from kdml.training.loading import run_config
from kdml.training.recipes import RECIPES, get_recipe
from kdml.training.run_folder import RunFolder

TINY = ["train.epochs=1", "train.steps_per_epoch=2", "data.batch_size=20",
        "data.samples_per_class=4", "model.embedding_size=8", "eval.nmi=false",
        "train.device=cpu", "--no-progress"]


def saved_run(folder: Path, recipe: str, *overrides: str) -> Path:
    """A run folder holding only the config.yaml kdml writes for ``recipe``."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = get_recipe(recipe)
    save_config(resolve_config(chosen.name, chosen.params, chosen.defaults, None,
                               list(overrides)), folder / "config.yaml")
    return folder


def without_line(path: Path, line: str) -> None:
    text = path.read_text()
    assert f"\n{line}\n" in text
    path.write_text(text.replace(f"\n{line}\n", "\n", 1))


def test_a_run_s_config_yaml_starts_with_its_format_and_reads_back_for_every_recipe(tmp_path):
    for name in RECIPES:
        run = saved_run(tmp_path / name, name)
        assert (run / "config.yaml").read_text().startswith(f"{FORMAT_KEY}: {CONFIG_FORMAT}\n")
        chosen = get_recipe(name)
        assert run_config(RunFolder(run)).to_dict() == resolve_config(
            chosen.name, chosen.params, chosen.defaults).to_dict()


@pytest.mark.parametrize(("recipe", "line", "key", "default"), [
    # the built-in defaults were 10 epochs and cosine: a resumed msimclr run would stop at
    # 10 of its 100, and kdml eval would score mtriplet's euclidean run with cosine
    ("msimclr", "  epochs: 100", "train.epochs", "epochs: 100"),
    ("mtriplet", "  metric: euclidean", "eval.metric", "metric: euclidean"),
    ("dtml", "  dataset: mnist5k->digits", "data.dataset", "dataset: mnist5k->digits"),
])
def test_a_setting_deleted_from_a_run_s_config_yaml_is_refused_naming_the_line(
        tmp_path, recipe, line, key, default):
    run = saved_run(tmp_path / "run", recipe)
    without_line(run / "config.yaml", line)
    with pytest.raises(KdmlError) as error:
        run_config(RunFolder(run))
    assert str(error.value) == (
        f"{run / 'config.yaml'} has no {key}, which kdml wrote there (a line deleted?): put "
        f"the line back under {key.split('.')[0]}: with the value the run trained with "
        f"({recipe}'s default is '{default}'); a deleted setting is not read as a default")


def test_a_run_s_config_yaml_without_its_eval_settings_says_how_many_it_lacks(tmp_path):
    run = saved_run(tmp_path / "run", "mtriplet")
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(re.sub(r"\neval:\n(  .*\n)+", "\neval: {}\n", text))
    with pytest.raises(KdmlError, match=r"has no eval\.ks \(and 3 more\), which kdml wrote"):
        run_config(RunFolder(run))


def test_a_run_s_config_yaml_from_before_the_format_line_reads_as_it_always_did(tmp_path):
    """The run folders kdml wrote before config_format (results/ in the repository) lack the
    settings added since, which take their built-in defaults, as they always did."""
    run = saved_run(tmp_path / "run", "msimclr", "train.epochs=7")
    path = run / "config.yaml"
    path.write_text(path.read_text().removeprefix(f"{FORMAT_KEY}: {CONFIG_FORMAT}\n"))
    for line in ("  flush_denormal: false", "  proj_hidden: 0", "  epochs: 7"):
        without_line(path, line)
    read = run_config(RunFolder(run))
    assert (read.train.epochs, read.train.flush_denormal, read.method.proj_hidden) == (10, False, 0)


@pytest.mark.parametrize("recipe", ["msimclr", "simclr"])
def test_a_config_yaml_from_before_joint_views_reads_the_views_forwarded_as_one_batch(
        tmp_path, recipe):
    """The SimCLR recipes forwarded both views as one batch before method.joint_views existed
    (today's default keeps them apart): a config.yaml from then, without the format line and
    the setting, reads true, or --resume would go on with the other forward pass."""
    run = saved_run(tmp_path / "run", recipe)
    path = run / "config.yaml"
    path.write_text(path.read_text().removeprefix(f"{FORMAT_KEY}: {CONFIG_FORMAT}\n"))
    assert run_config(RunFolder(run)).method.joint_views is False  # as written
    without_line(path, "  joint_views: false")
    assert run_config(RunFolder(run)).method.joint_views is True


def test_a_setting_added_after_a_run_s_format_reads_as_the_runs_before_it_computed(
        tmp_path, monkeypatch):
    """A setting added to kdml later raises the format: a run folder of the format before it
    lacks the setting and reads the value recorded for it; one of the new format is refused."""
    run = saved_run(tmp_path / "run", "jrd")
    without_line(run / "config.yaml", "  flush_denormal: false")
    monkeypatch.setattr(config, "CONFIG_FORMAT", CONFIG_FORMAT + 1)
    monkeypatch.setattr(config, "ADDED_IN_FORMAT",
                        {"train.flush_denormal": (CONFIG_FORMAT + 1, True)})
    assert run_config(RunFolder(run)).train.flush_denormal is True
    path = run / "config.yaml"
    path.write_text(path.read_text().replace(f"{FORMAT_KEY}: {CONFIG_FORMAT}\n",
                                             f"{FORMAT_KEY}: {CONFIG_FORMAT + 1}\n"))
    with pytest.raises(KdmlError, match=r"has no train\.flush_denormal, which kdml wrote"):
        run_config(RunFolder(run))


def test_the_settings_of_the_format_kdml_writes_are_those_it_was_written_with():
    """Adding or removing a setting changes what a run folder of this format holds: raise
    config.CONFIG_FORMAT and name an added setting in config.ADDED_IN_FORMAT (with the value
    that computes what runs before it computed), then update the digest here. Without that, the
    run folders written before it would be refused as lacking the new setting."""
    keys = sorted(f"{name}:{key}" for name, recipe in RECIPES.items()
                  for key in all_keys(RunConfig(recipe=name, method=recipe.params()))
                  if config.ADDED_IN_FORMAT.get(key, (0, None))[0] <= 1)
    assert hashlib.sha1("\n".join(keys).encode()).hexdigest()[:16] == "d81ca62424519cc2"


@pytest.mark.parametrize(("value", "message"), [
    ("2", f"was written by a newer kdml ({FORMAT_KEY}: 2; this one reads up to 1): upgrade "
          "kdml to read the run"),
    ("one", f": {FORMAT_KEY} is 'one', but kdml writes {FORMAT_KEY}: 1; put that line back"),
    ("true", f": {FORMAT_KEY} is True, but kdml writes {FORMAT_KEY}: 1;"),
    ("0", f": {FORMAT_KEY} is 0, but kdml writes {FORMAT_KEY}: 1;"),
])
def test_a_run_s_config_format_line_edited_is_refused_in_one_line(tmp_path, value, message):
    run = saved_run(tmp_path / "run", "jrd")
    path = run / "config.yaml"
    path.write_text(path.read_text().replace(f"{FORMAT_KEY}: 1\n", f"{FORMAT_KEY}: {value}\n"))
    with pytest.raises(KdmlError, match=re.escape(message)):
        run_config(RunFolder(run))


def test_a_run_s_config_yaml_is_taken_as_a_config_file_and_its_format_is_no_setting(
        tmp_path, capsys):
    """A run's config.yaml reused as --config (its format line has no effect) prints the same
    config as the run's; ``config_format=1`` as an override is refused as no setting."""
    run = saved_run(tmp_path / "run", "msimclr", "train.epochs=3")
    assert cli.main(["config", "--config", str(run / "config.yaml")]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == run_config(RunFolder(run)).to_dict()
    assert cli.main(["config", "jrd", f"{FORMAT_KEY}=1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kdml: error: {FORMAT_KEY} is not a setting but the format of the config.yaml kdml "
        "writes into a run folder; it has no effect on a run")


@pytest.mark.parametrize(("line", "message"), [
    # YAML reads each as another type than the text the setting takes
    ("data: {root: 2024}", "data.root=2024 has the wrong type; expected str: YAML reads 2024 "
                           "as a number; put it in quotes, e.g. '2024', for text"),
    ("data: {root: 2024-01-31}", "YAML reads 2024-01-31 as a date; put it in quotes, e.g. "
                                 "'2024-01-31', for text"),
    ("data: {root: no}", "YAML reads yes, no, on, off, true and false as booleans; put the "
                         "text in quotes"),
    ("model: {weights: }", "YAML reads an empty value (or null, ~) as none; write '' for no "
                           "text"),
    ("eval: {nmi: 1}", "eval.nmi=1 has the wrong type; expected bool: write true or false"),
    ("train: {deterministic: 0}", "expected bool: write true or false"),
    ("train: {epochs: '10'}", "train.epochs='10' has the wrong type; expected int: write 10, "
                              "without quotes"),
    ("train: {epochs: 20.0}", "expected int: write 20, a whole number"),
    ("train: {epochs: 1e3}", "train.epochs='1e3' has the wrong type; expected int: write 1000"),
    # a float setting as an int one: a quoted number is text (it had been taken as 0.1)
    ("optim: {lr: '0.1'}", "optim.lr='0.1' has the wrong type; expected float: write 0.1, "
                           "without quotes"),
    ('optim: {lr: "10"}', "optim.lr='10' has the wrong type; expected float: write 10, "
                          "without quotes"),
])
def test_a_config_file_value_of_the_wrong_type_says_what_to_write(tmp_path, capsys, line,
                                                                  message):
    path = tmp_path / "c.yaml"
    path.write_text(f"recipe: jrd\n{line}\n")
    assert cli.main(["config", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err and err.startswith("kdml: error: ")


def test_an_override_of_the_wrong_type_says_what_to_write(capsys):
    assert cli.main(["config", "jrd", "train.deterministic=1"]) == 2
    assert capsys.readouterr().err.strip().endswith("expected bool: write true or false")


@pytest.mark.parametrize(("override", "message"), [
    ("optim.lr='0.1'", "optim.lr='0.1' has the wrong type; expected float: write 0.1, "
                       "without quotes"),
    ("optim.lr=' 0.1'", "optim.lr=' 0.1' has the wrong type; expected float: write 0.1, "
                        "without quotes"),
    ("optim.lr='1_0'", "optim.lr='1_0' has the wrong type; expected float"),
    ("train.epochs='3'", "train.epochs='3' has the wrong type; expected int: write 3, "
                         "without quotes"),
])
def test_a_quoted_number_is_text_to_a_float_setting_as_to_an_int_one(capsys, override,
                                                                     message):
    """A float setting had taken any text Python reads as a float ('0.1', ' 0.1', and '1_0'
    as 10.0) where an int one refuses '3'; YAML 1.1's own text numbers (1e-3, which it reads
    as text however written) are still numbers, and its nan still refused by name."""
    assert cli.main(["config", "jrd", override]) == 2
    assert capsys.readouterr().err.strip() == f"kdml: error: {message}"
    for written, value in (("1e-3", 0.001), ("'1e-3'", 0.001), ("1.5e3", 1500.0),
                           ("0.1", 0.1), (".5e-2", 0.005)):
        assert cli.main(["config", "jrd", f"optim.lr={written}"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["optim"]["lr"] == value
    assert cli.main(["config", "jrd", "optim.lr=nan"]) == 2
    assert capsys.readouterr().err.strip() == ("kdml: error: optim.lr must be a finite number, "
                                               "got nan")


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("edits") / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     *TINY]) == 0
    return out


def test_more_epochs_in_a_config_yaml_an_editor_saved_its_own_way_are_trained(
        one_epoch_run, tmp_path):
    """Sections reordered, a comment, Windows line ends and a byte-order mark: the edit of
    train.epochs is taken."""
    run = tmp_path / "run"
    shutil.copytree(one_epoch_run, run)
    path = run / "config.yaml"
    values = yaml.safe_load(path.read_text())
    values["train"]["epochs"] = 2
    text = yaml.safe_dump(dict(reversed(list(values.items()))), sort_keys=False)
    text = text.replace("  epochs: 2\n", "  epochs: 2  # one more\n")
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert len(json.loads((run / "metrics.json").read_text())["epochs"]) == 2


def test_eval_of_a_run_whose_config_yaml_lost_a_line_is_refused(one_epoch_run, tmp_path,
                                                                capsys):
    run = tmp_path / "run"
    shutil.copytree(one_epoch_run, run)
    without_line(run / "config.yaml", "  nmi: false")
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kdml: error: {run / 'config.yaml'} has no eval.nmi, which kdml "
                          "wrote there") and "\n" not in err
    assert not (run / "eval.json").exists()


def test_a_format_1_config_that_lacks_a_setting_added_before_the_format_line_deleted_it():
    """ADDED_BEFORE_FORMAT fills only a file from before the format line (format 0): a
    config.yaml of format 1 held every setting, so one of those it lacks was deleted and is
    refused, not read as the value older runs computed with (a mutation audit: filling it for
    format 1 too had passed every test)."""
    from kdml.config import RunConfig, missing_settings
    from kdml.training.recipes.atlas import MSimCLRParams

    config = RunConfig(recipe="msimclr", method=MSimCLRParams())
    values = config.to_dict()
    del values["data"]["validation"]
    del values["method"]["joint_views"]
    assert missing_settings(config, values, 1) == (["data.validation", "method.joint_views"],
                                                   {})
    assert missing_settings(config, values, 0) == (
        [], {"data.validation": 0.0, "method.joint_views": True})
