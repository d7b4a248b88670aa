"""Counts and settings given to the public API: NumPy integers (a loop over ``np.arange``)
and floats are taken as Python ones everywhere, and bools are refused in one line everywhere."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from kdml.checks import is_finite_number, is_positive_int
from kdml.errors import KdmlError


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.uint8(2), np.int32(1)])
def test_positive_python_and_numpy_integers_are_counts(value):
    assert is_positive_int(value)


@pytest.mark.parametrize("value", [0, -2, np.int64(0), True, np.bool_(True), 2.0, np.float64(2),
                                   "3", None, torch.tensor(3)])
def test_anything_else_is_not_a_count(value):
    assert not is_positive_int(value)


@pytest.mark.parametrize(("value", "above", "at_least", "expected"), [
    (0.5, None, None, True), (np.float32(0.5), 0, None, True), (np.int64(2), None, 2, True),
    (-3, None, None, True), (0.0, 0, None, False), (0.0, None, 0, True), (-1e-9, None, 0, False),
    (float("inf"), None, None, False), (float("nan"), None, None, False),
    (np.float64("nan"), None, None, False), (True, None, None, False),
    (np.bool_(True), None, None, False), ("1.0", None, None, False), (None, None, None, False),
    (torch.tensor(1.0), None, None, False), (1 + 0j, None, None, False),
])
def test_finite_numbers(value, above, at_least, expected):
    assert is_finite_number(value, above=above, at_least=at_least) is expected


@pytest.mark.parametrize("setting", ["nt_xent temperature", "am_softmax scale",
                                     "laplace bandwidth", "ddml sharpness"])
def test_a_bool_is_no_setting_and_a_numpy_float_is_one(setting):
    """True had passed as NT-Xent's temperature 1 (numbers.Real includes bool)."""
    from kdml.kernels import LaplaceKernel
    from kdml.losses.am_softmax import am_softmax_loss
    from kdml.losses.nt_xent import nt_xent_loss
    from kdml.losses.pairwise_logistic import PairwiseLogisticLoss

    call = {"nt_xent temperature": lambda value: nt_xent_loss(torch.randn(4, 3), value),
            "am_softmax scale": lambda value: am_softmax_loss(torch.zeros(2, 3),
                                                              torch.tensor([0, 1]), value, 0.1),
            "laplace bandwidth": LaplaceKernel,
            "ddml sharpness": lambda value: PairwiseLogisticLoss(sharpness=value)}[setting]
    with pytest.raises(KdmlError, match=r"finite number > 0(, at least [^,]*)?, got True"):
        call(True)
    call(np.float32(0.5))


def _counts_of_the_api():
    """(name, builder of an object from one count) for every public count check."""
    from kdml.data.domains import DomainPair, fit_source_pca
    from kdml.evaluation.knn import check_positive_int
    from kdml.evaluation.reid import single_shot_cmc
    from kdml.kernels import GaussianMixtureKernel, PolynomialKernel
    from kdml.losses.marginal_fisher import MarginalFisherLoss
    from kdml.models.atlas_heads import AtlasHead
    from kdml.models.backbones import feature_size_of
    from kdml.models.dtml import DTMLNetwork
    from kdml.regularizers.manifold import ManifoldMMD
    from kdml.training.recipes.atlas import MTripletParams

    def backbone(size):
        module = torch.nn.Linear(2, 2)
        module.feature_size = size
        return feature_size_of(module)

    def pca(dim):
        from kdml.data.dataset import ArrayDataset
        x = torch.from_numpy(np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32))
        y = torch.arange(6) % 2
        pair = DomainPair(ArrayDataset("s", "s", x, y), ArrayDataset("t", "t", x, y), "s->t", "")
        return fit_source_pca(pair, dim)

    return {
        "mixture kernels": lambda k: GaussianMixtureKernel(num_kernels=k),
        "polynomial degree": lambda k: PolynomialKernel(degree=k),
        "marginal Fisher k1": lambda k: MarginalFisherLoss(k1=k),
        "atlas head charts": lambda k: AtlasHead(4, 2, k),
        "backbone width": backbone,
        "DTML layer": lambda k: DTMLNetwork([4, k]),
        "manifold MMD charts": lambda k: ManifoldMMD(2, k),
        "MTriplet charts": lambda k: MTripletParams(n_charts=k).validate(),
        "re-id splits": lambda k: single_shot_cmc(np.eye(4), [0, 0, 1, 1], num_splits=k),
        "re-id ranks": lambda k: single_shot_cmc(np.eye(4), [0, 0, 1, 1], ranks=(k,)),
        "PCA dim": pca,
        "evaluation count": lambda k: check_positive_int("chunk_size", k),
    }


@pytest.mark.parametrize("name", sorted(_counts_of_the_api()))
def test_every_count_of_the_api_takes_numpy_integers_and_refuses_bools(name):
    build = _counts_of_the_api()[name]
    build(np.int64(2))
    for wrong in (True, 2.0, 0):
        with pytest.raises(KdmlError, match=re.escape(repr(wrong))):
            build(wrong)


def test_numpy_integers_set_from_python_are_saved_as_python_numbers(tmp_path):
    """Taken by the checks, a NumPy integer reached config.yaml, where YAML could not write
    it (a RepresenterError traceback, and a run folder left with only its lock)."""
    import dataclasses

    import yaml

    from kdml.config import resolve_config, save_config
    from kdml.training.recipes import get_recipe
    from kdml.training.recipes.atlas import MTripletParams

    params = MTripletParams(n_charts=np.int64(4), dim=np.int32(2))
    params.validate()
    assert type(params.n_charts) is int and type(params.dim) is int
    recipe = get_recipe("mtriplet")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, {}, [])
    config = dataclasses.replace(config, method=dataclasses.replace(
        config.method, n_charts=np.int64(3)))
    config.eval.ks = [np.int64(1), np.int64(2)]
    config.optim.lr = np.float64(0.5)
    save_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["method"]["n_charts"] == 3 and saved["eval"]["ks"] == [1, 2]
    assert saved["optim"]["lr"] == 0.5


def test_array_arguments_of_counts_are_taken_too():
    """Re-identification's ranks as np.arange, Recall@K's ks as an array, transfer's k as a
    NumPy integer (each had its own check; ranks refused an array)."""
    from kdml.evaluation import retrieval_metrics
    from kdml.evaluation.reid import single_shot_cmc
    from kdml.evaluation.transfer import source_nn_accuracy

    x = np.random.default_rng(0).normal(size=(8, 3))
    ids = np.arange(8) % 4
    assert set(single_shot_cmc(x, ids, ranks=np.arange(1, 3))) == {"cmc@1", "cmc@2",
                                                                  "gallery_size"}
    assert "recall@2" in retrieval_metrics(x, ids, ks=np.array([1, 2]), nmi=False)
    assert 0 <= source_nn_accuracy(x, ids, x, ids, k=np.int64(3)) <= 1
    for wrong in (np.array([[1, 2]]), "12", np.array([1.0])):
        with pytest.raises(KdmlError, match="ranks must be a sequence of positive integers"):
            single_shot_cmc(x, ids, ranks=wrong)


def _settings_of_type(kind: type) -> list[tuple[type, str]]:
    """(params class, field name) for every field of a recipe's params whose default is a
    ``kind`` (float or int)."""
    import dataclasses

    from kdml.training.recipes import RECIPES

    params = {recipe.params for recipe in RECIPES.values()}
    return sorted({(settings, item.name) for settings in params
                   for item in dataclasses.fields(settings)
                   if type(getattr(settings(), item.name)) is kind},
                  key=lambda pair: (pair[0].__name__, pair[1]))


@pytest.mark.parametrize(("params", "name"), _settings_of_type(float),
                         ids=lambda value: getattr(value, "__name__", value))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_setting_of_a_recipe_s_params_refuses_nan_and_infinity(params, name, value):
    """Built in Python (no config, whose values are checked as read), JRDParams(alpha=nan) gave
    a NaN loss: range checks such as alpha < 0 let NaN and infinity through."""
    import dataclasses

    with pytest.raises(KdmlError, match=rf"^method\.{name} must be a finite number, got "
                                        rf"{re.escape(repr(value))}$"):
        dataclasses.replace(params(), **{name: value}).validate()


@pytest.mark.parametrize(("params", "name"), _settings_of_type(int),
                         ids=lambda value: getattr(value, "__name__", value))
def test_every_int_setting_of_a_recipe_s_params_checks_its_type(params, name):
    """Built in Python, PCAParams(pca_dim=1.5) and JRDParams(pool_num_kernels=2.5) were taken
    and failed later inside torch, and DTMLParams(k1="5") raised a raw TypeError from its range
    check: each int setting refuses a float, a string and a bool in one line, and takes a
    NumPy integer as its Python int."""
    import dataclasses

    for wrong in (2.5, "2", True):
        with pytest.raises(KdmlError, match=rf"^method\.{name}={re.escape(repr(wrong))} has "
                                            r"the wrong type; expected int$"):
            dataclasses.replace(params(), **{name: wrong}).validate()
    default = getattr(params(), name)
    settings = dataclasses.replace(params(), **{name: np.int64(default)})
    settings.validate()
    assert type(getattr(settings, name)) is int and getattr(settings, name) == default


def test_the_list_and_float_settings_of_a_recipe_s_params_check_their_types():
    from kdml.training.recipes.dtml import DTMLParams
    from kdml.training.recipes.jrd import JRDParams

    with pytest.raises(KdmlError, match=r"^method\.layer_sizes=\[2\.5\] has the wrong type; "
                                        r"expected a list of int"):
        DTMLParams(layer_sizes=[2.5]).validate()
    sizes = DTMLParams(layer_sizes=list(np.arange(3, 5)))
    sizes.validate()
    assert sizes.layer_sizes == [3, 4] and {type(size) for size in sizes.layer_sizes} == {int}
    with pytest.raises(KdmlError, match=r"^method\.scale='big' has the wrong type; "
                                        r"expected float$"):
        JRDParams(scale="big").validate()
    weights = JRDParams(alpha=np.float32(0.5))
    weights.validate()
    assert type(weights.alpha) is float and weights.alpha == 0.5


def test_a_zero_dim_cpu_setting_goes_with_inputs_on_any_device_and_others_are_refused():
    """torch combines a 0-dim CPU tensor with any device's, so a learned scale kept on the CPU
    is taken beside inputs elsewhere; a 1-element CPU tensor is not (a mutation audit:
    refusing both had passed every test)."""
    from kdml.checks import check_setting_device

    inputs = torch.zeros(4, 2, device="meta")
    check_setting_device("Loss", "scale", torch.tensor(2.0), inputs, "embeddings")
    with pytest.raises(KdmlError, match=r"^Loss got a scale on cpu and embeddings on meta; "
                                        r"move the scale to meta$"):
        check_setting_device("Loss", "scale", torch.tensor([2.0]), inputs, "embeddings")


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 0.5])
def test_an_infinite_float_label_is_no_whole_number(bad):
    """``inf == inf.round()``: without the finiteness check an infinite label passed as whole
    and ``.long()`` made it -9223372036854775808, a class of its own (a mutation audit)."""
    from kdml.checks import whole_number_labels

    with pytest.raises(KdmlError, match=r"^Table: labels must be whole numbers \(class "
                                        r"indices\), got "):
        whole_number_labels("Table", torch.tensor([0.0, 1.0, bad]))
    assert whole_number_labels("Table", np.array([0.0, 2.0])).tolist() == [0, 2]


@pytest.mark.parametrize(("labels", "shown"), [
    ([1e20, 2e20], "1e+20"), ([0.0, 2.0 ** 63], "9.223372036854776e+18"),
    (np.array([3.0, -1e19]), "-1e+19"), (torch.tensor([1e20, 2e20], dtype=torch.float64), "1e+20"),
    (np.array([2 ** 63, 1], dtype=np.uint64), "9223372036854775808")])
def test_labels_beyond_int64_are_refused_naming_the_first(labels, shown):
    """Whole floats beyond int64 (and uint64 past its top) had become -2**63 in ``.long()``:
    1e20 and 2e20 one class, silently; -2**63 itself, within the range, is kept exactly."""
    from kdml.checks import whole_number_labels
    from kdml.data.dataset import ArrayDataset

    with pytest.raises(KdmlError, match=re.escape(
            f"Table: labels must be class indices within int64's range (|label| < 2**63), got "
            f"{shown}; map the classes to 0..C-1 first")):
        whole_number_labels("Table", labels)
    with pytest.raises(KdmlError, match=r"^toy: labels must be class indices within int64"):
        ArrayDataset("toy", "toy", torch.zeros(2, 3), labels)
    assert whole_number_labels("Table", [-2.0 ** 63, 2.0 ** 62]).tolist() == [-2 ** 63, 2 ** 62]


def test_a_list_of_float_labels_keeps_float64_precision():
    """torch.as_tensor makes a list of Python floats float32, in which 16777217.0 is
    16777216.0: two labels had become one class."""
    from kdml.checks import whole_number_labels

    assert whole_number_labels("Table", [16777216.0, 16777217.0]).tolist() == [16777216,
                                                                                16777217]


def test_generalization_refuses_float_labels_beyond_int64():
    """The cast of 1e20 and 2e20 to int64 made both -2**63, one seen class, with NumPy's
    RuntimeWarning alone."""
    from kdml.evaluation.generalization import generalization_terms

    points = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(KdmlError, match=re.escape(
            "seen_labels must be class labels within int64's range (|label| < 2**63), got "
            "1e+20;")):
        generalization_terms(points, np.r_[np.full(10, 1e20), np.full(10, 2e20)], points,
                             np.arange(20) % 2 + 5, repeats=2)


@pytest.mark.parametrize("base", [2**53, 2**63])
def test_generalization_takes_uint64_labels_beside_int64_ones_as_integers(base):
    """NumPy joins uint64 and int64 arrays as float64, where 2**53 and 2**53 + 1 (or 2**63 and
    2**63 + 1) are one number: two seen classes beside disjoint int64 unseen classes had been
    refused as "seen and unseen classes overlap". They are read as the same classes
    renumbered, the uint64 ones on either side."""
    from kdml.evaluation.generalization import generalization_terms, nn_error

    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(size=(40, 3)), rng.normal(size=(40, 3))
    few, many = np.arange(40) % 2, np.arange(40) % 3 + 5  # classes 0-1 and 5-7
    wide = few.astype(np.uint64) + np.uint64(base)
    assert generalization_terms(seen, wide, unseen, many, repeats=3) == \
        generalization_terms(seen, few, unseen, many, repeats=3)
    assert generalization_terms(unseen, many, seen, wide, repeats=3) == \
        generalization_terms(unseen, many, seen, few, repeats=3)
    assert nn_error(seen, wide, unseen, many) == nn_error(seen, few, unseen, many) == 1.0


def test_generalization_refuses_uint64_labels_beyond_int64_beside_negative_ones():
    """No integer type holds 2**63 and -1 together (NumPy would join them as float64)."""
    from kdml.evaluation.generalization import generalization_terms

    points = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(KdmlError, match=re.escape(
            "seen_labels and unseen_labels mix uint64 labels beyond int64's range (up to "
            "9223372036854775809) with negative ones (down to -2), which no integer type holds "
            "together; renumber the classes")):
        generalization_terms(points, np.arange(20, dtype=np.uint64) % 2 + np.uint64(2**63),
                             points, -(np.arange(20) % 2) - 1, repeats=2)


def test_labels_of_two_dimensions_are_refused_naming_their_shape():
    """[N, 1] labels (a table's column kept 2-D) had given 2-D index tensors; they are refused
    in one line (a mutation audit: dropping the check had passed every test here)."""
    from kdml.checks import check_label_vector

    check_label_vector("Sampler", torch.tensor([0, 1, 1]))
    with pytest.raises(KdmlError, match=re.escape("Sampler: labels must be [N], one per sample, "
                                                  "got shape (3, 1)")):
        check_label_vector("Sampler", torch.tensor([[0], [1], [1]]))


def test_check_params_validates_the_params_it_takes():
    """check_params refuses another type and then runs the params' own checks: a negative
    margin built by a library user is refused there (a mutation audit: skipping the
    validation had passed every test)."""
    from kdml.checks import check_params
    from kdml.training.recipes.atlas import TripletParams

    check_params("Triplet", TripletParams(margin=0.5), TripletParams)
    with pytest.raises(KdmlError, match="method.margin must be >= 0"):
        check_params("Triplet", TripletParams(margin=-1.0), TripletParams)
    with pytest.raises(KdmlError, match="params must be a TripletParams instance, got a dict"):
        check_params("Triplet", {"margin": 0.5}, TripletParams)
