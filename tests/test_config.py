import re

import pytest
import yaml

from kdml import config as kdml_config
from kdml.config import load_config_file, override_parts, resolve_config
from kdml.errors import KdmlError
from kdml.training.recipes.jrd import AMSoftmaxParams


def resolve(*overrides, file_values=None, settings=None):
    return resolve_config("amsoftmax", AMSoftmaxParams, None, file_values, list(overrides),
                          settings)


def test_defaults_then_file_then_overrides():
    config = resolve("epochs=3", file_values={"train": {"epochs": 7, "seed": 5}})
    assert config.train.epochs == 3  # the override wins over the file
    assert config.train.seed == 5
    assert config.method.scale == 20.0


def test_full_and_leaf_keys_and_types():
    config = resolve("optim.lr=1e-2", "margin=0.2", "eval.ks=[1,10]", "proxy_lr=1")
    assert config.optim.lr == pytest.approx(0.01)
    assert config.method.margin == 0.2
    assert config.eval.ks == [1, 10]
    assert isinstance(config.optim.proxy_lr, float)


def test_unknown_key_suggests_nearest():
    with pytest.raises(KdmlError, match="did you mean 'train.epochs'"):
        resolve("train.epoch=3")
    with pytest.raises(KdmlError, match="did you mean 'margin'"):
        resolve("margn=0.1")


@pytest.mark.parametrize(("item", "owners"), [
    ("method.dim=2", "mtriplet, triplet, msimclr, simclr"),  # an Atlas config's method block
    ("dim=2", "mtriplet, triplet, msimclr, simclr"),  # had been "did you mean 'pca_dim'?"
    ("alpha=0.5", "jrd, mrd, jrd-c, jrd-pooling, jmmd, jintra, intra, dtml, dstml, ddml"),
])
def test_another_recipe_s_method_setting_names_the_recipes_that_have_it(item, owners):
    """A method setting of other recipes (a config file of another recipe, a flag copied from
    another command) had been answered with the nearest spelling: method.dim for amsoftmax
    "did you mean 'method.margin'?", a setting that has nothing to do with it."""
    with pytest.raises(KdmlError) as refused:
        resolve(item)
    assert str(refused.value).endswith(
        f"for recipe 'amsoftmax': it is a method setting of {owners} ('kdml config amsoftmax' "
        "lists amsoftmax's keys)")


def test_a_misspelt_method_setting_is_still_guessed():
    with pytest.raises(KdmlError, match="did you mean 'method.margin'\\?$"):
        resolve("method.margn=0.1")


@pytest.mark.parametrize("item, message", [
    ("recipe=mrd", "recipe is not a setting: name the recipe as the command's first argument"),
    ("paper=x", "paper is not a setting but a config file's description"),
    ("grid={alpha: [1, 2]}", "grid is not a setting but a config file's grid of settings"),
])
def test_a_config_file_s_own_line_as_an_override_says_what_it_is(item, message):
    """recipe=mrd had been "unknown config key 'recipe' for recipe 'amsoftmax'; did you mean
    'resize'?", and paper=x "... lists every key": neither said why, nor where a recipe goes."""
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}"):
        resolve(item)


@pytest.mark.parametrize("item, nearest", [("TRAIN.EPOCHS=3", "train.epochs"),
                                            ("EPOCHS=3", "epochs"), ("Optim.LR=1", "optim.lr")])
def test_a_key_in_other_case_is_suggested_in_kdml_s(item, nearest):
    """difflib's ratio is case-sensitive: TRAIN.EPOCHS had no suggestion at all."""
    with pytest.raises(KdmlError, match=f"did you mean '{re.escape(nearest)}'\\?$"):
        resolve(item)


@pytest.mark.parametrize(("item", "hint"), [
    ("DOMAIN.beta=1", "did you mean 'domain.beta'?"),
    ("Method.beta=1", "did you mean 'method.beta'?"),
    ("BETA=1", "did you mean 'domain.beta' or 'method.beta'?"),
    ("train.LR=0.1", "did you mean 'optim.lr'?"),
    ("DOMAIN=1", "did you mean 'domain.beta'?"),
])
def test_a_key_in_other_case_names_the_one_setting_it_differs_from_in_case(item, hint):
    """dtml has domain.beta and method.beta: DOMAIN.beta had been guessed as either ("did you
    mean 'domain.beta' or 'method.beta'?"), BETA as 'beta' (refused next as ambiguous);
    train.LR as 'train.seed', and a section in other case (DOMAIN) had no guess."""
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("dtml")
    with pytest.raises(KdmlError, match=f"; {re.escape(hint)}$"):
        resolve_config("dtml", recipe.params, recipe.defaults, None, [item])


def test_an_empty_section_of_a_file_is_named_as_such():
    """`train:` with its keys commented out is null in YAML: the refusal had said "'train' is a
    section, not a setting; set one of its keys, e.g. train.epochs=VALUE", an override's
    wording for a line that set nothing."""
    with pytest.raises(KdmlError, match=r"^the config file's train: is empty; give it settings, "
                                        r"e.g. train: \{epochs: ...\}, or drop the line$"):
        resolve(file_values={"train": None})


@pytest.mark.parametrize("item", ["epochs", "=3", "bad key=1"])
def test_malformed_override(item):
    with pytest.raises(KdmlError, match="malformed override"):
        override_parts(item)


@pytest.mark.parametrize("item, key, expected", [
    ("data.root=2024", "data.root", "2024"),  # YAML: an int
    ("data.root=0010", "data.root", "0010"),  # YAML 1.1: the octal 8
    ("data.root=no", "data.root", "no"),  # YAML 1.1: False
    ("model.weights=1e3.pth", "model.weights", "1e3.pth"),
    ("train.device=cuda:", "train.device", None),  # YAML: {'cuda': None}
    ("data.root='quoted dir'", "data.root", "quoted dir"),  # YAML's own string: unquoted
    ("data.root=photos #2", "data.root", "photos #2"),  # YAML: a comment, cut off unsaid
    ("data.root=@data", "data.root", "@data"),  # YAML: a reserved indicator, refused
    ("model.weights= w.pth ", "model.weights", "w.pth"),
])
def test_a_text_setting_takes_an_override_as_written(item, key, expected):
    """The shell has taken the user's quotes, so a folder named 2024 or no could not be given
    as an override at all ("has the wrong type; expected str"), and one named 'photos #2' was
    read as 'photos' without a word."""
    if expected is None:
        with pytest.raises(KdmlError, match=r"train.device must be auto, cpu, cuda or cuda:N, "
                                            r"got 'cuda:'$"):
            resolve(item)
        return
    section, leaf = key.split(".")
    assert getattr(getattr(resolve(item), section), leaf) == expected


@pytest.mark.parametrize("file_values, spellings", [
    ({"train": {"epochs": 2}, "epochs": 3}, "as train.epochs and as epochs"),
    # the same key twice: said as written ("as train.epochs and as train.epochs" said neither)
    ({"train": {"epochs": 2}, "train.epochs": 3}, "as train: {epochs: ...} and as train.epochs"),
    ({"train.epochs": 3, "train": {"epochs": 2}}, "as train.epochs and as train: {epochs: ...}"),
    ({"dataset": "digits", "data": {"dataset": "mnist5k"}}, "as dataset and as data.dataset"),
])
def test_a_config_file_that_sets_a_setting_twice_is_refused(file_values, spellings):
    """YAML's check of a key given twice sees one mapping's keys only: the last spelling had
    won without a word."""
    setting = "train.epochs" if "epochs" in spellings else "data.dataset"
    with pytest.raises(KdmlError, match=f"^the config file sets {setting} twice, "
                                        f"{re.escape(spellings)}; keep one$"):
        resolve(file_values=file_values)


def test_a_grid_written_as_dotted_keys_is_refused_not_ignored():
    with pytest.raises(KdmlError, match=r"^grid\.margin is not a setting; a config file's grid "
                                        r"is one mapping"):
        resolve(file_values={"grid.margin": [0.1, 0.2]})


def test_a_grid_key_that_is_not_text_is_refused_in_one_line():
    from kdml.training.grid import grid_cells

    for key in (1, True, None):
        with pytest.raises(KdmlError, match=f"^grid key {key!r} is not a config key"):
            grid_cells({key: [1, 2]})


def test_a_grid_value_reaches_a_text_setting_as_the_file_gives_it():
    """Cells went through override text, where PyYAML's end-of-document marker made a value
    of 2024 the text '2024\n...', and null the text 'null'."""
    from kdml.training.grid import grid_cells

    cells = grid_cells({"data.root": [2024, "x"], "model.weights": [None, "w.pth"]})
    settings = [cell.values for cell in cells]
    assert settings[3] == {"data.root": "x", "model.weights": "w.pth"}
    assert resolve(settings=None).data.root == ""
    with pytest.raises(KdmlError, match=r"^data.root=2024 has the wrong type; expected str: "
                                        r"YAML reads 2024 as a number; put it in quotes"):
        resolve_config("amsoftmax", AMSoftmaxParams, None, None, None, settings[0])
    config = resolve_config("amsoftmax", AMSoftmaxParams, None, None, None, settings[3])
    assert (config.data.root, config.model.weights) == ("x", "w.pth")


def test_wrong_type_and_range():
    with pytest.raises(KdmlError, match="wrong type"):
        resolve("epochs=many")
    with pytest.raises(KdmlError, match="train.epochs must be at least 1"):
        resolve("epochs=0")
    with pytest.raises(KdmlError, match="margin"):
        resolve("margin=2")


def test_a_run_folder_as_the_config_file_names_its_config_yaml(tmp_path):
    """--resume and the commands that read a run take its folder; --config given one had said
    only "is not a file", as it still does for a folder that holds no run."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("recipe: jrd\n")
    with pytest.raises(KdmlError, match=f"^config file {re.escape(str(tmp_path / 'run'))} is "
                                        "not a file; a run folder's settings are its "
                                        f"{re.escape(str(tmp_path / 'run' / 'config.yaml'))}$"):
        load_config_file(tmp_path / "run")
    with pytest.raises(KdmlError, match="is not a file$"):
        load_config_file(tmp_path)


def test_config_file_errors(tmp_path):
    with pytest.raises(KdmlError, match="does not exist"):
        load_config_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed")
    with pytest.raises(KdmlError, match="not valid YAML"):
        load_config_file(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(KdmlError, match="mapping"):
        load_config_file(listed)
    # PyYAML keeps the last of a repeated key: "epochs: 1" then "epochs: 2" trained 2 epochs
    twice = tmp_path / "twice.yaml"
    twice.write_text("recipe: jrd\ntrain:\n  epochs: 1\n  lr_note: x\n  epochs: 2\n")
    with pytest.raises(KdmlError, match=r"^config file .*twice\.yaml is not valid YAML: key "
                                        r"'epochs' is given twice \(lines 3 and 5\): keep one$"):
        load_config_file(twice)
    nested = tmp_path / "nested.yaml"  # the same key in two sections is two keys
    nested.write_text("train:\n  epochs: 1\neval:\n  epochs: 2\n")
    assert load_config_file(nested) == {"train": {"epochs": 1}, "eval": {"epochs": 2}}
    # YAML merge keys are not repeated keys: a merged key may be given again, overriding it
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &c\n  epochs: 1\n  seed: 1\ntrain:\n  <<: *c\n  seed: 3\n")
    assert load_config_file(merged)["train"] == {"epochs": 1, "seed": 3}
    unhashable = tmp_path / "unhashable.yaml"  # refused in one line, not a TypeError
    unhashable.write_text("? [a, b]\n: 1\n")
    with pytest.raises(KdmlError, match="is not valid YAML"):
        load_config_file(unhashable)


@pytest.mark.parametrize(("override", "message"), [
    ("optim.weight_decay=-1", "optim.weight_decay must be >= 0"),
    ("optim.lr_gamma=0", "optim.lr_gamma must be in (0, 1]"),
    ("optim.lr_gamma=-0.5", "optim.lr_gamma must be in (0, 1]"),
    ("optim.lr_gamma=1.5", "optim.lr_gamma must be in (0, 1]"),
    ("data.dataset=", "dataset name is empty"),
    ("data.dataset=' '", "dataset name is empty"),
    # a traceback of the allocator, and of islice after training an epoch
    ("model.embedding_size=1000000000", "model.embedding_size must be from 1 to 65,536"),
    ("eval.embed_batch_size=100000000000000000000",
     "eval.embed_batch_size must be from 1 to 2,147,483,648"),
])
def test_settings_of_the_right_type_that_make_no_sense(override, message):
    with pytest.raises(KdmlError, match=re.escape(message)):
        resolve(override)


def test_the_edges_of_the_decay_and_weight_decay_ranges_are_accepted():
    config = resolve("optim.weight_decay=0", "optim.lr_gamma=1", "optim.lr_step=1")
    assert (config.optim.weight_decay, config.optim.lr_gamma) == (0.0, 1.0)


@pytest.mark.parametrize("override", [
    "method.scale=nan", "method.margin=.nan", "optim.lr_gamma=nan", "optim.lr=inf",
    "optim.lr=.inf", "optim.weight_decay=-inf", "train.tolerance=NaN", "domain.beta=1e999",
])
def test_a_float_that_is_nan_or_infinite_is_refused_naming_its_key(override):
    key = override.split("=")[0]
    with pytest.raises(KdmlError, match=rf"^{re.escape(key)} must be a finite number, got"):
        resolve(override)


def test_a_nan_in_a_config_file_is_refused_naming_its_key(tmp_path):
    from kdml.training.recipes.jrd import JRDParams

    path = tmp_path / "jrd.yaml"
    path.write_text("recipe: jrd\nmethod:\n  alpha: .nan\n")
    with pytest.raises(KdmlError, match=r"^method\.alpha must be a finite number"):
        resolve_config("jrd", JRDParams, None, load_config_file(path), [])


def config_command(tmp_path, capsys, text: str, *overrides: str) -> tuple[int, str, str]:
    """``kdml config --config FILE`` of a file holding ``text``: the exit code, stdout and
    stderr."""
    from kdml import cli

    path = tmp_path / "grid.yaml"
    path.write_text(text)
    code = cli.main(["config", "--config", str(path), *overrides])
    out, err = capsys.readouterr()
    return code, out, err


def test_kdml_config_names_a_file_s_grid_and_prints_its_first_cell(tmp_path, capsys):
    import yaml

    code, out, err = config_command(tmp_path, capsys, "recipe: jrd\ntrain: {keep_best: true}\n"
                                    "grid: {data.validation: [0.2], train.seed: [3, 4]}\n")
    # the file's values alone (keep_best without data.validation) were refused before
    assert (code, err) == (0, "")
    assert out.startswith(f"# {tmp_path / 'grid.yaml'} holds a grid of 2 runs over "
                          "data.validation, train.seed, one per cell;\n# printed: the first "
                          "cell's config, validation=0.2-seed=3\nrecipe: jrd\n")
    printed = yaml.safe_load(out)
    assert (printed["data"]["validation"], printed["train"]["seed"]) == (0.2, 3)


@pytest.mark.parametrize(("text", "overrides", "message"), [
    ("grid: {method.alpah: [0, 1]}", [],
     "unknown config key 'method.alpah' for recipe 'jrd'; did you mean 'method.alpha'?"),
    ("grid: {method.alpha: [0, -1]}", [], "method.alpha"),  # a bad value in the second cell
    ("grid: {method.alpha: [0, 1]}", ["alpha=2"], "the override alpha=2 sets method.alpha"),
    ("grid: {train.seed: [0, 0]}", [], "grid.train.seed lists 0 twice"),
    # the file's own value of a grid key had been dropped without a word, in every cell
    ("method: {alpha: 0.5}\ngrid: {method.alpha: [0.1, 1]}", [],
     "the config file sets method.alpha: 0.5 and its grid runs over method.alpha"),
    ("epochs: 3\ngrid: {train.epochs: [1, 2]}", [],
     "the config file sets epochs: 3 and its grid runs over train.epochs"),
    # kdml config had printed it
    ("grid: {data.validation: [0, 0.2]}", [], "the grid's cells have different data.validation"),
])
def test_kdml_config_refuses_a_grid_as_kdml_train_does(tmp_path, capsys, text, overrides,
                                                       message):
    from kdml import cli

    code, _, err = config_command(tmp_path, capsys, f"recipe: jrd\n{text}\n", *overrides)
    assert code == 2 and message in err
    assert cli.main(["train", "--config", str(tmp_path / "grid.yaml"), *overrides,
                     "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == err


@pytest.mark.parametrize("command", ["config", "train"])
def test_a_second_config_file_is_refused_not_read_instead_of_the_first(tmp_path, capsys,
                                                                        command):
    """argparse keeps the last --config: the first file's train.epochs: 7 had been dropped
    without a word (a 10-epoch run, or kdml config printing 10)."""
    from kdml import cli

    (tmp_path / "a.yaml").write_text("recipe: jrd\ntrain: {epochs: 7}\n")
    (tmp_path / "b.yaml").write_text("recipe: jrd\ntrain: {seed: 9}\n")
    code = cli.main([command, "--config", str(tmp_path / "a.yaml"),
                     f"--config={tmp_path / 'b.yaml'}", "--out", str(tmp_path / "run"),
                     "--dataset", "digits", "epochs=1", "train.steps_per_epoch=1"]  # if run
                    if command == "train" else
                    [command, "--config", str(tmp_path / "a.yaml"), "--config",
                     str(tmp_path / "b.yaml")])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == (f"kdml: error: --config is given twice ({tmp_path / 'a.yaml'} and "
                   f"{tmp_path / 'b.yaml'}); kdml reads one config file: put the settings in "
                   f"one, or give the other's as key=value (see 'kdml {command} --help')\n")
    assert not (tmp_path / "run").exists()


def test_invalid_yaml_is_named_by_its_problem_and_line(tmp_path):
    """The message had been PyYAML's context alone: "while scanning for the next token"."""
    tabbed = tmp_path / "tab.yaml"
    tabbed.write_text("recipe: jrd\ntrain:\n\tepochs: 2\n")
    with pytest.raises(KdmlError, match=r"^config file .*tab\.yaml is not valid YAML: found "
                                        r"character '\\t' that cannot start any token \(line 3\)$"):
        load_config_file(tabbed)


@pytest.mark.parametrize("override, message", [
    ("train.seed=010", "'010' is read by YAML 1.1 as octal (8): write 10 or 8"),
    ("train.seed=-0_10", "'-0_10' is read by YAML 1.1 as octal (-8): write -10 or -8"),
    ("eval.ks=[1, 010]", "'010' is read by YAML 1.1 as octal (8): write 10 or 8"),
    ("train.epochs=1:30", "'1:30' is read by YAML 1.1 as base 60 (90): write 90"),
    ("optim.lr=0:0.5", "'0:0.5' is read by YAML 1.1 as base 60 (0.5): write 0.5"),
])
def test_a_number_yaml_1_1_reads_otherwise_than_it_looks_is_refused(override, message):
    """PyYAML follows YAML 1.1: seed=010 had trained with seed 8 and epochs=1:30 for 90
    epochs, without a word. An override read as YAML sets no text (a text setting's takes
    its text as written), so it is not told to quote the value "as text": quoted, it was then
    refused as the wrong type."""
    with pytest.raises(KdmlError, match=f"^override {re.escape(repr(override))}: "
                                        f"{re.escape(message)}$"):
        resolve(override)


@pytest.mark.parametrize("override, key, expected", [
    ("train.seed=0", "train.seed", 0), ("train.seed=00", "train.seed", 0),
    ("train.seed=1_000", "train.seed", 1000), ("train.seed=0x10", "train.seed", 16),
    ("optim.lr=0.05", "optim.lr", 0.05), ("optim.lr=00.5", "optim.lr", 0.5),
])
def test_numbers_that_read_as_they_look_are_kept(override, key, expected):
    section, leaf = key.split(".")
    assert getattr(getattr(resolve(override), section), leaf) == expected


def test_a_config_file_s_octal_number_is_refused_with_its_line(tmp_path):
    octal = tmp_path / "octal.yaml"
    octal.write_text("recipe: jrd\ntrain:\n  seed: 010\n")
    with pytest.raises(KdmlError, match=r"^config file .*octal\.yaml: '010' is read by YAML "
                                        r"1\.1 as octal \(8\): write 10 or 8, or quote it as "
                                        r"text \(line 3\)$"):
        load_config_file(octal)


def test_a_config_write_cut_short_leaves_no_truncated_config_yaml(tmp_path, monkeypatch):
    """config.yaml had been written in place: a full disk left its first lines, which --resume
    read with the lost settings at their defaults."""
    import errno
    import pathlib

    from kdml.config import save_config
    from kdml.training.recipes import get_recipe

    recipe = get_recipe("jrd")
    config = resolve_config("jrd", recipe.params, recipe.defaults)
    real_write_text = pathlib.Path.write_text

    def full_disk(self, text, *args, **kwargs):
        real_write_text(self, text[:200], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left") as error:
        save_config(config, tmp_path / "config.yaml")
    assert error.value.filename == str(tmp_path / "config.yaml")  # one line from the CLI
    assert list(tmp_path.iterdir()) == []  # neither a truncated file nor a partial one


@pytest.mark.parametrize(("override", "message"), [
    ("optim.lr_decay=1.5", "optim.lr_decay must be in (0, 1]"),  # m07: rates that grow
    ("optim.lr_milestones=[2,2]", "optim.lr_milestones must be increasing"),  # m08: /100 at 2
    ("optim.head_lr=1e35", "must be at most 1e+30"),  # m09: a collapsed run
    ("train.seed=18446744073709551616", "train.seed must be from 0 to 2**63 - 1"),  # m14
    ("optim.lr=true", "optim.lr=True has the wrong type; expected float"),  # m05: lr 1.0
    ("train.epochs=true", "train.epochs=True has the wrong type; expected int"),  # m13
    ("data.batch_size=1", "data.batch_size must be at least 2"),  # m01
])
def test_values_each_refusal_of_the_config_reaches(override, message):
    """Values no test had given, so that removing their refusal (a mutation audit) passed every
    test: each is refused in one line naming its setting."""
    with pytest.raises(KdmlError) as error:
        resolve(override)
    text = str(error.value)
    assert "\n" not in text and override.split("=")[0] in text and message in text


@pytest.mark.parametrize("quoted", ["'photos\"", "\"photos'"])
def test_unmatched_quotes_in_an_override_are_kept_as_written(quoted):
    """Only a matched pair of quotes is YAML's string: data.root='photos" keeps its text (it had
    become photos, with no test to tell)."""
    assert resolve(f"data.root={quoted}").data.root == quoted


def test_an_override_s_value_may_hold_an_equals_sign():
    """An override is split at its first ``=``: the rest, ``=`` included, is the value (a
    split at the last had read ``data.root=a=b`` as the key ``data.root=a``)."""
    assert resolve("data.root=runs/lr=0.1").data.root == "runs/lr=0.1"
    assert resolve("eval.ks=[1, 2]", "method.margin=0.25").method.margin == 0.25


def test_a_boolean_for_a_number_setting_says_to_write_a_number():
    """``lr: yes`` reads as True in YAML 1.1: the refusal says what to write instead."""
    with pytest.raises(KdmlError, match=re.escape(
            "optim.lr=True has the wrong type; expected float: write a number, e.g. 0.5")):
        resolve(file_values={"optim": {"lr": True}})


def test_check_fields_stores_a_numpy_number_as_its_python_number():
    """A library user's NumPy numbers (a loop over ``np.arange``) become the Python numbers
    the params' docstring promises, in the params themselves (a check that only read them had
    passed every test)."""
    import numpy as np

    from kdml.config import check_fields
    from kdml.training.recipes.atlas import TripletParams

    params = TripletParams(dim=np.int64(3), margin=np.float32(0.25))
    check_fields(params)
    assert (type(params.dim), type(params.margin)) == (int, float)
    assert (params.dim, params.margin) == (3, 0.25)
    params = TripletParams(dim=3, margin=1)  # an int for a float setting: a float
    check_fields(params)
    assert type(params.margin) is float


def test_to_dict_gives_the_numpy_numbers_of_a_list_setting_as_python_ones():
    """``eval.ks = list(np.arange(1, 3))`` set from Python: each item becomes its Python
    number, which YAML can write (a mutation audit: leaving lists as they were passed every
    test, and safe_dump refused the run's config.yaml)."""
    import numpy as np
    import yaml

    config = resolve()
    config.eval.ks = list(np.arange(1, 3))
    config.optim.lr_milestones = (np.int64(2), 5)
    values = config.to_dict()
    assert values["eval"]["ks"] == [1, 2] and type(values["eval"]["ks"][0]) is int
    assert type(values["optim"]["lr_milestones"][0]) is int
    yaml.safe_dump(values)


YAML_CASES = [
    "train: {epochs: 3, seed: 7}\noptim:\n  lr: 1e-3\n  name: adam\n",
    "base: &base {epochs: 2}\ntrain:\n  <<: *base\n  seed: 1\n",
    "flags: [yes, no, on, off, true, ~, null]\nwhen: 2024-01-02\n",
    "floats: [.inf, -.inf, .nan, 1.5e+3, 0.1, -2.]\nints: [0x1f, 1_000, -3]\n",
    "text: 'it''s'\nescaped: \"caf\\u00e9\\t\\n\"\nfolded: >\n  a\n  b\nkept: |\n  c\n",
    "data:\n  root: ~/photos #2\n  dataset: 'folder:é'\n",
    "# only a comment\n",
    "",
    "data:\n  root: !\n",  # libyaml builds '' where PyYAML builds None
]


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
@pytest.mark.parametrize("text", YAML_CASES)
def test_libyaml_and_pyyaml_read_a_config_alike(text):
    """Where PyYAML has libyaml, its parser reads config files: what it builds must be what
    the Python loader builds (merge keys, YAML 1.1's booleans, dates, floats, escapes)."""
    expected = yaml.load(text, Loader=kdml_config._UniqueKeyLoader)  # noqa: S506 (a safe loader)
    assert repr(kdml_config._load_yaml(text)) == repr(expected)  # repr: nan is nan, True is not 1


@pytest.mark.parametrize("text", ["a: 1\n\tb: 2\n", "a: [1, 2\n", "a: 'open\n", "a: b: c\n",
                                  "a: 1\na: 2\n", "seed: 010\n", "- a\nb: 1\n",
                                  "a: \udcff\n",  # an argument's byte that is not UTF-8
                                  # libyaml reads these (tabs where YAML allows them; a
                                  # '?' in a flow's plain text); PyYAML, and so kdml, do not
                                  "train:\n  epochs:\t2\n", "eval: {ks: [1? 2, 4]}\n"])
def test_yaml_pyyaml_refuses_is_refused_in_its_words(text):
    """What PyYAML refuses is refused, in PyYAML's words (the ones kdml's messages are written
    and tested for): libyaml's messages differ, and it reads some of this text."""
    with pytest.raises(yaml.YAMLError) as python_error:
        yaml.load(text, Loader=kdml_config._UniqueKeyLoader)  # noqa: S506 (a safe loader)
    with pytest.raises(yaml.YAMLError) as error:
        kdml_config._load_yaml(text)
    assert str(error.value) == str(python_error.value)
