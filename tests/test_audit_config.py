"""Audit of kdml.config: every range check at its edge, the enumerated settings, the key
resolution and the override parsing that hand-made mutants of the config code showed untested.

Each range is checked on both sides of its limit: the value at the limit (accepted, or refused
where the limit is open) and the nearest value past it, so that ``<`` for ``<=`` (or a dropped
check) fails a test.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys

import pytest

from kdml import cli
from kdml.config import (
    check_fields,
    load_config_file,
    override_parts,
    resolve_config,
    with_absolute_paths,
)
from kdml.errors import KdmlError
from kdml.training.recipes import get_recipe
from kdml.training.recipes.jrd import AMSoftmaxParams


def resolve(*overrides: str):
    return resolve_config("amsoftmax", AMSoftmaxParams, None, None, list(overrides))


@pytest.mark.parametrize("overrides", [
    ("data.batch_size=2",), ("data.batch_size=0",),
    ("data.num_workers=-1",), ("data.num_workers=0",), ("data.num_workers=256",),
    ("data.resize=8", "data.image_size=8"), ("data.resize=8192",),
    ("data.resize=8", "data.image_size=1"),
    ("eval.embed_batch_size=1",), ("eval.embed_batch_size=2147483648",),
    ("data.holdout_fraction=0.001",), ("data.holdout_fraction=0.999",),
    ("data.validation=0",), ("data.validation=0.999",),
    ("optim.adam_eps=1e-300",), ("optim.weight_decay=0",),
    ("optim.adam_eps=1e30", "optim.weight_decay=1e30"),
    ("train.steps_per_epoch=0",), ("optim.lr_decay=1",), ("optim.lr_decay=1e-9",),
    ("train.tolerance=0",), ("train.patience=0",), ("domain.beta=0",),
    ("data.samples_per_class=0",), ("train.seed=0",), ("train.seed=9223372036854775807",),
    ("train.eval_every=1",), ("train.epochs=1",), ("optim.head_lr=0",),
    ("optim.lr=1e30", "optim.proxy_lr=1e30", "optim.head_lr=1e30"),
    ("optim.lr_step=0",), ("optim.lr_milestones=[1, 2]",),
    ("model.embedding_size=1",), ("model.embedding_size=65536",), ("eval.ks=[1]",),
])
def test_a_setting_at_the_edge_of_its_range_is_accepted(overrides):
    resolve(*overrides)


@pytest.mark.parametrize(("overrides", "message"), [
    (("data.batch_size=1",), "data.batch_size must be at least 2 (or 0 for full batches)"),
    (("data.num_workers=-2",), "data.num_workers must be from 0 to 256 (or -1 = automatic)"),
    (("data.num_workers=257",), "data.num_workers must be from 0 to 256 (or -1 = automatic)"),
    (("data.resize=7", "data.image_size=7"), "data.resize must be from 8 to 8,192 pixels"),
    (("data.resize=8193",), "data.resize must be from 8 to 8,192 pixels"),
    (("data.image_size=0",), "data.image_size must be from 1 to data.resize (the short side "
                             "images are resized to before the crop), here 256; it is 0"),
    (("data.resize=8", "data.image_size=9"),
     "data.image_size must be from 1 to data.resize (the short side images are resized to before "
     "the crop), here 8; it is 9"),
    (("eval.embed_batch_size=0",), "eval.embed_batch_size must be from 1 to 2,147,483,648"),
    (("eval.embed_batch_size=2147483649",),
     "eval.embed_batch_size must be from 1 to 2,147,483,648"),
    (("data.holdout_fraction=0",), "data.holdout_fraction must be in (0, 1)"),
    (("data.holdout_fraction=1",), "data.holdout_fraction must be in (0, 1)"),
    (("data.validation=-0.1",), "data.validation must be in [0, 1)"),
    (("data.validation=1",), "data.validation must be in [0, 1)"),
    (("data.pca_dim=-1",), "data.pca_dim must be >= 0 (0 = no PCA)"),
    (("optim.adam_eps=0",), "optim.adam_eps must be positive"),
    (("optim.weight_decay=-1e-9",), "optim.weight_decay must be >= 0 (0 = none)"),
    (("optim.weight_decay=1e31",), "optim.adam_eps and optim.weight_decay must be at most"),
    (("train.steps_per_epoch=-1",), "train.steps_per_epoch must be >= 0"),
    (("optim.lr_decay=0",), "optim.lr_decay must be in (0, 1]"),
    (("optim.lr_decay=1.0000001",), "optim.lr_decay must be in (0, 1]"),
    (("train.tolerance=-1e-9",), "train.tolerance must be >= 0"),
    (("train.patience=-1",), "train.patience must be >= 0 (0 = never stop early)"),
    (("domain.beta=-1e-9",), "domain.beta must be >= 0"),
    (("data.samples_per_class=-1",), "data.samples_per_class must be >= 0"),
    (("train.epochs=0",), "train.epochs must be at least 1"),
    (("train.seed=-1",), "train.seed must be from 0 to 2**63 - 1"),
    (("train.seed=9223372036854775808",), "train.seed must be from 0 to 2**63 - 1"),
    (("train.eval_every=0",), "train.eval_every must be at least 1"),
    (("optim.lr=0",), "learning rates must be positive"),
    (("optim.proxy_lr=0",), "learning rates must be positive"),
    (("optim.head_lr=-1e-9",), "learning rates must be positive"),
    (("optim.lr=1.0000001e30",), "must be at most 1e+30"),
    (("optim.proxy_lr=1.0000001e30",), "must be at most 1e+30"),
    (("optim.lr_step=-1",), "optim.lr_step must be >= 0 (0 = no decay)"),
    (("optim.lr_milestones=[0, 5]",), "optim.lr_milestones must be increasing epoch numbers"),
    (("optim.lr_milestones=[5, 3]",), "optim.lr_milestones must be increasing epoch numbers"),
    (("optim.lr_step=5", "optim.lr_milestones=[3]"),
     "set optim.lr_step or optim.lr_milestones, not both"),
    (("model.embedding_size=0",), "model.embedding_size must be from 1 to 65,536"),
    (("model.embedding_size=65537",), "model.embedding_size must be from 1 to 65,536"),
    (("eval.ks=[1, 0]",), "eval.ks must be positive ints"),
    (("train.patience=2",), "train.keep_best and train.patience choose an epoch by its scores"),
    (("data.validation=0", "train.keep_best=true"),
     "train.keep_best and train.patience choose an epoch by its scores"),
])
def test_a_setting_just_past_the_edge_of_its_range_is_refused_in_one_line(overrides, message):
    with pytest.raises(KdmlError) as error:
        resolve(*overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(("override", "message"), [
    ("data.split=random", "data.split must be standard, class-disjoint or seen-holdout"),
    ("data.on_bad_image=ignore", "data.on_bad_image must be error or skip"),
    ("optim.name=adamw", "optim.name must be adam, sgd or rmsprop"),
    ("train.precision=fp8", "train.precision must be fp32, bf16 or fp16"),
    ("model.pooling=mean", "model.pooling must be avg, max or avg+max"),
    ("domain.kernel=rbf", "domain.kernel must be linear or gaussian"),
    ("eval.metric=dot", "eval.metric must be cosine or euclidean"),
    ("train.device=gpu", "train.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
])
def test_a_choice_outside_its_list_is_refused_naming_the_choices(override, message):
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}$"):
        resolve(override)


@pytest.mark.parametrize("override", [
    "data.split=class-disjoint", "data.split=seen-holdout", "data.on_bad_image=skip",
    "optim.name=sgd", "optim.name=rmsprop", "train.precision=bf16", "train.precision=fp16",
    "model.pooling=max", "model.pooling=avg+max", "domain.kernel=gaussian",
    "eval.metric=euclidean", "train.device=cuda:1", "train.device=cpu",
])
def test_every_documented_choice_is_accepted(override):
    resolve(override)


@pytest.mark.parametrize("key", ["data.root", "model.weights", "data.dataset"])
def test_a_path_setting_holding_a_nul_byte_is_refused_in_one_line(key):
    with pytest.raises(KdmlError, match=rf"^{re.escape(key)}='a\\x00b' holds a NUL byte"):
        resolve(f"{key}=a\0b")


def test_a_single_value_for_a_list_setting_is_a_list_of_one():
    assert resolve("eval.ks=5").eval.ks == [5]
    assert resolve("optim.lr_milestones=3").optim.lr_milestones == [3]


def test_a_leaf_name_of_two_sections_is_refused_as_ambiguous():
    recipe = get_recipe("dtml")
    with pytest.raises(KdmlError, match=r"^config key 'beta' is ambiguous; write one of: "
                                        r"domain\.beta, method\.beta$"):
        resolve_config("dtml", recipe.params, recipe.defaults, None, ["beta=1"])
    config = resolve_config("dtml", recipe.params, recipe.defaults, None, ["domain.beta=1"])
    assert config.domain.beta == 1.0


def test_a_setting_under_the_wrong_section_suggests_its_own_section():
    with pytest.raises(KdmlError, match=r"did you mean 'optim\.lr'\?$"):
        resolve("train.lr=0.1")


@pytest.mark.parametrize(("key", "guess"), [("embeding", "embedding_size"),
                                             ("holdout", "holdout_fraction")])
def test_a_loosely_misspelt_key_is_still_guessed(key, guess):
    """difflib's cutoff 0.6: these spellings score 0.6 to 0.75 against their setting."""
    with pytest.raises(KdmlError, match=f"did you mean '{guess}'"):
        resolve(f"{key}=1")


def test_a_lone_quote_is_a_text_setting_s_text_not_an_empty_pair():
    assert resolve("data.root='").data.root == "'"
    assert resolve('data.root="').data.root == '"'


@pytest.mark.parametrize("key", ["train.epochs", "optim.lr", "eval.ks"])
@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_override_of_a_number_names_the_empty_text(key, text):
    with pytest.raises(KdmlError, match=rf"^{re.escape(key)}='' has the wrong type"):
        resolve(f"{key}={text}")


def test_spaces_around_an_override_s_key_are_not_part_of_it():
    assert override_parts(" train.epochs =3") == ("train.epochs", "3")
    assert resolve(" epochs = 3").train.epochs == 3


def test_a_section_given_as_a_setting_is_refused_with_an_example_key():
    with pytest.raises(KdmlError, match=r"^'train' is a section, not a setting; set one of its "
                                        r"keys, e\.g\. train\.epochs=VALUE \('kdml config "
                                        r"amsoftmax' lists them\)$"):
        resolve("train=3")


@pytest.mark.parametrize("text", ["", "# nothing set yet\n"])
def test_an_empty_config_file_is_an_empty_mapping(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    assert load_config_file(path) == {}


def test_check_fields_refuses_nan_inside_a_list_of_floats_and_none_for_a_union():
    """A library user's params dataclass: NaN in a list[float] field, and None for a union
    without None, are refused as they are for a single float."""

    @dataclasses.dataclass
    class Weighted:
        weights: list[float] = dataclasses.field(default_factory=lambda: [1.0, math.nan])

    with pytest.raises(KdmlError, match=r"^method\.weights must be a finite number"):
        check_fields(Weighted())
    check_fields(Weighted(weights=[1, 2.5]))

    @dataclasses.dataclass
    class Either:
        size: int | float = 1

    with pytest.raises(KdmlError, match=r"^method\.size=None has the wrong type"):
        check_fields(Either(size=None))  # type: ignore[arg-type]
    check_fields(Either(size=2.5))


def test_a_wrong_list_of_text_names_a_list_of_text_as_its_example():
    recipe = get_recipe("jrd")
    with pytest.raises(KdmlError, match=r"^method\.layers=5 has the wrong type; expected a list "
                                        r"of str, e\.g\. method\.layers=\[a,b\]$"):
        resolve_config("jrd", recipe.params, recipe.defaults, None, ["method.layers=5"])


def test_a_tuple_for_a_list_setting_is_taken_as_its_list():
    config = resolve_config("amsoftmax", AMSoftmaxParams, None, None, None,
                            {"eval.ks": (1, 5), "optim.lr_milestones": (2, 4)})
    assert (config.eval.ks, config.optim.lr_milestones) == ([1, 5], [2, 4])


@pytest.mark.parametrize("command", [["config", "jrd"], ["train", "jrd", "--seed", "1"],
                                     ["train", "--config", "GRID"], ["config", "--config", "GRID"]])
@pytest.mark.parametrize("argv", [["eval.ks=[1,", "2]"], ["method.layers=[pool,", "emb]"]])
def test_a_list_split_by_the_shell_is_said_to_need_quotes(capsys, tmp_path, argv, command):
    """`kdml train jrd eval.ks=[1, 2]` reaches kdml as two arguments; the refusal named only the
    first half as malformed, not why (kdml train, whose check of its flags against the
    overrides came first, then said "malformed override '2]'")."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: jrd\ngrid: {optim.lr: [0.001, 0.002]}\n")
    assert cli.main([str(grid) if part == "GRID" else part for part in command] + argv) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: malformed value in override {argv[0]!r}; the shell splits an unquoted "
        "value at its spaces: quote the whole override, e.g. 'eval.ks=[1, 2]'\n")


def test_a_plus_signed_octal_is_refused_as_octal():
    with pytest.raises(KdmlError, match=r"^override 'train\.seed=\+010': '\+010' is read by YAML "
                                        r"1\.1 as octal \(8\): write 10 or 8"):
        resolve("train.seed=+010")


@pytest.mark.parametrize("item", ["eval.ks=[1,2", "train.epochs={a", "optim.lr=*x"])
def test_an_override_value_that_is_not_yaml_is_named_malformed(item):
    with pytest.raises(KdmlError, match=rf"^malformed value in override {re.escape(repr(item))}$"):
        resolve(item)


def test_a_run_stores_its_home_relative_paths_expanded(tmp_path, monkeypatch):
    """``~`` in data.root and model.weights is the user's home, not a folder named ``~`` under
    the current one, once a run stores its paths absolute."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    config = with_absolute_paths(resolve("data.root=~/data", "model.weights=~/w.pth",
                                         "data.dataset=csv:~/t.csv"))
    home = tmp_path / "home"
    assert (config.data.root, config.model.weights) == (str(home / "data"), str(home / "w.pth"))
    assert config.data.dataset == f"csv:{home / 't.csv'}"
    assert with_absolute_paths(resolve()).data.root == ""


# ----------------------------------------------------------------- defects the audit found


def test_an_integer_past_floats_range_is_an_infinite_float_setting(capsys):
    """optim.lr=1 and 400 zeros had stopped kdml with float()'s OverflowError traceback; it is
    refused as 1e999 is."""
    huge = "1" + "0" * 400
    for key, sign in (("optim.lr", ""), ("method.margin", "-")):
        assert cli.main(["config", "amsoftmax", f"{key}={sign}{huge}"]) == 2
        assert capsys.readouterr().err == (f"kdml: error: {key} must be a finite number, "
                                           f"got {sign}inf\n")


@pytest.mark.parametrize(("text", "key"), [("train: &a\n  more: *a\n", "train.more"),
                                           ("train: &a\n  x: {more: *a}\n", "train.x.more")])
def test_a_config_file_whose_mapping_holds_itself_is_refused_in_one_line(tmp_path, capsys,
                                                                         text, key):
    """PyYAML builds a mapping that holds itself from an alias inside its own anchor: the
    flattening of the file had recursed without end (RecursionError)."""
    config_file = tmp_path / "loop.yaml"
    config_file.write_text(text)
    assert cli.main(["config", "amsoftmax", "--config", str(config_file)]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: {key} holds the mapping it is in (a YAML alias, *name, inside its own "
        "anchor, &name): write its values out\n")


def test_an_alias_of_a_mapping_used_twice_is_no_loop(tmp_path, capsys):
    config_file = tmp_path / "twice.yaml"
    config_file.write_text("train: &t {epochs: 2}\n")
    assert cli.main(["config", "amsoftmax", "--config", str(config_file)]) == 0
    assert "epochs: 2" in capsys.readouterr().out


@pytest.mark.parametrize("digits", ["1" * 5000, "0" + "1" * 5000])
def test_a_number_of_more_digits_than_python_reads_is_refused_in_one_line(tmp_path, capsys,
                                                                          digits):
    """Python reads at most 4,300 digits from text: PyYAML's ValueError had come through as a
    traceback, from a config file and from an override (the octal check reads it too)."""
    limit = f"{sys.get_int_max_str_digits():,}"
    config_file = tmp_path / "long.yaml"
    config_file.write_text(f"train:\n  seed: {digits}\n")
    assert cli.main(["config", "amsoftmax", "--config", str(config_file)]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: config file {config_file}: a number of {len(digits):,} characters, more "
        f"digits than Python reads ({limit}) (line 2)\n")
    assert cli.main(["config", "amsoftmax", f"train.seed={digits}"]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: override 'train.seed={digits}': a number of {len(digits):,} characters, "
        f"more digits than Python reads ({limit})\n")


@pytest.mark.parametrize("text", ["0x_", "-0b__"])
def test_a_yaml_int_without_digits_is_not_said_to_have_too_many(tmp_path, capsys, text):
    """YAML 1.1 reads 0x_ as a hex int, whose digits Python then found none of: the refusal
    said "a number of 3 characters, more digits than Python reads (4,300)"."""
    config_file = tmp_path / "hex.yaml"
    config_file.write_text(f"train:\n  seed: {text}\n")
    problem = (f"{text!r} is read by YAML 1.1 as a number without digits: write a number, or "
               "quote it as text")
    assert cli.main(["config", "amsoftmax", "--config", str(config_file)]) == 2
    assert capsys.readouterr().err == (
        f"kdml: error: config file {config_file}: {problem} (line 2)\n")
    assert cli.main(["config", "amsoftmax", f"train.seed={text}"]) == 2
    unquoted = problem.removesuffix(", or quote it as text")  # an override sets no text here
    assert capsys.readouterr().err == f"kdml: error: override 'train.seed={text}': {unquoted}\n"
