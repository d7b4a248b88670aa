import pytest

from kdml.config import load_config_file, parse_override, resolve_config
from kdml.errors import KdmlError
from kdml.training.recipes.jrd import AMSoftmaxParams


def resolve(*overrides, file_values=None):
    return resolve_config("amsoftmax", AMSoftmaxParams, None, file_values, list(overrides))


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


@pytest.mark.parametrize("item", ["epochs", "=3", "bad key=1"])
def test_malformed_override(item):
    with pytest.raises(KdmlError, match="malformed override"):
        parse_override(item)


def test_wrong_type_and_range():
    with pytest.raises(KdmlError, match="wrong type"):
        resolve("epochs=many")
    with pytest.raises(KdmlError, match="train.epochs must be at least 1"):
        resolve("epochs=0")
    with pytest.raises(KdmlError, match="margin"):
        resolve("margin=2")


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
