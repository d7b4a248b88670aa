"""Mixed precision: kernels, regularizers and distances compute in float32 or wider whatever the
input dtype (value and gradient as float64's within 1e-3), and training runs under autocast."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import yaml

from kdml import cli
from kdml.atlas import manifold_distance
from kdml.kernels import (
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    LaplaceKernel,
    MomentGeneratingKernel,
    PolynomialKernel,
    squared_distances,
)
from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.losses.nt_xent import nt_xent_loss
from kdml.models.backbones import build_backbone
from kdml.precision import AUTOCAST_DTYPES
from kdml.regularizers import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)
from kdml.regularizers.domain import DomainMMD
from kdml.regularizers.manifold import ChartMembershipLoss, ManifoldMMD
from kdml.training import build

LABELS = torch.arange(4).repeat_interleave(4)
WEIGHTS = torch.rand(16, 16, generator=torch.Generator().manual_seed(9), dtype=torch.float64)


def weighted(matrix):
    """A scalar whose gradient reaches every entry of ``matrix`` differently."""
    return (matrix * WEIGHTS.to(matrix.dtype)).sum()


def normal(*shape):
    return lambda generator: torch.randn(shape, generator=generator)


def jrd_inputs(generator):
    return [torch.randn(16, 32, generator=generator),
            F.normalize(torch.randn(16, 8, generator=generator), dim=1),
            torch.randn(16, 4, generator=generator)]


def chart_inputs(generator):
    return [torch.randn(16, 3, 2, generator=generator),
            torch.softmax(torch.randn(16, 3, generator=generator), dim=1)]


def kernels_of(*numbers):
    return [GaussianMixtureKernel(num_kernels=n) for n in numbers]


# name -> (inputs drawn in float32 from a generator, function of the inputs -> scalar)
CASES = {
    "gaussian mixture": (normal(16, 12), lambda x: weighted(GaussianMixtureKernel(3)(x))),
    "laplace": (normal(16, 12), lambda x: weighted(LaplaceKernel()(x))),
    "polynomial": (normal(16, 6), lambda x: weighted(PolynomialKernel(degree=2)(x))),
    "mgf": (normal(16, 6), lambda x: weighted(MomentGeneratingKernel()(x / 4))),
    "imq": (normal(16, 4), lambda x: weighted(InverseMultiquadricKernel(4 / 6)(x))),
    "squared distances": (normal(16, 12), lambda x: weighted(squared_distances(x, x))),
    "JRS": (jrd_inputs, lambda *x: JointRepresentationSimilarity(kernels_of(3, 3, 1))(
        list(x), LABELS)),
    "JointMMD": (jrd_inputs, lambda *x: JointMMD(kernels_of(3, 3, 1))(list(x), LABELS)),
    "JointIntra": (jrd_inputs, lambda *x: JointIntra(kernels_of(3, 3, 1))(list(x), LABELS)),
    "intra-class penalty": (normal(16, 8), lambda x: IntraClassPenalty()([x], LABELS)),
    "manifold MMD": (chart_inputs, lambda coords, q: ManifoldMMD(2, 3)(
        coords, q, prior_sample=torch.linspace(0.05, 0.95, 32).view(16, 2))),
    "chart loss": (lambda g: chart_inputs(g)[1], lambda q: ChartMembershipLoss()(q)),
    "domain MMD": (lambda g: [torch.randn(16, 6, generator=g), torch.randn(10, 6, generator=g)],
                   lambda s, t: DomainMMD()(s, t)),
    "gaussian domain MMD": (
        lambda g: [torch.randn(16, 6, generator=g), torch.randn(10, 6, generator=g)],
        lambda s, t: DomainMMD(GaussianMixtureKernel(3))(s, t)),
    "marginal Fisher": (normal(16, 6), lambda x: MarginalFisherLoss(k1=2, k2=3)(x, LABELS)),
    "AM-Softmax": (lambda g: torch.rand(16, 5, generator=g) * 2 - 1,
                   lambda cosines: am_softmax_loss(cosines, LABELS % 5, 20.0, 0.1)),
    "NT-Xent": (normal(16, 6), lambda x: nt_xent_loss(x, 0.5)),
    "manifold distance": (chart_inputs, lambda coords, q: weighted(manifold_distance(
        q, coords, q, coords))),
}
# Half an ulp of each dtype: a gradient computed exactly is still rounded to it on its way back.
ROUNDING = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def value_and_gradients(function, inputs):
    leaves = [tensor.clone().requires_grad_() for tensor in inputs]
    value = function(*leaves)
    value.backward()
    return value, [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_low_precision_inputs_give_the_float64_value_and_gradient(name, dtype):
    """The value within 1e-3 of float64's on the same (rounded) inputs; the gradient within
    1e-3 too, plus its final rounding to the input's dtype."""
    make, function = CASES[name]
    drawn = make(torch.Generator().manual_seed(0))
    inputs = [x.to(dtype) for x in (drawn if isinstance(drawn, list) else [drawn])]
    value, gradients = value_and_gradients(function, inputs)
    value64, gradients64 = value_and_gradients(function, [x.double() for x in inputs])
    assert value.dtype == torch.float32  # computed, and returned, in float32
    assert value.item() == pytest.approx(value64.item(), rel=1e-3, abs=1e-6)
    for gradient, gradient64 in zip(gradients, gradients64, strict=True):
        assert gradient.dtype == dtype  # gradients reach the inputs in their own dtype
        error = (gradient.double() - gradient64).norm() / gradient64.norm()
        assert error <= 1e-3 + ROUNDING[dtype], (name, float(error))


def test_jrs_on_float16_is_the_float64_value():
    """Before the maths ran in float32, JRS on these float16 inputs gave 0.370 for 0.0508."""
    generator = torch.Generator().manual_seed(3)
    pool = 10 * torch.randn(100, 1024, generator=generator)
    emb = F.normalize(torch.randn(100, 512, generator=generator), dim=1)
    cls = torch.randn(100, 100, generator=generator)
    labels = torch.arange(10).repeat_interleave(10)
    jrs = JointRepresentationSimilarity(kernels_of(3, 3, 1))
    half = [t.half() for t in (pool, emb, cls)]
    value = jrs(half, labels)
    reference = jrs([t.double() for t in half], labels)
    assert value.item() == pytest.approx(reference.item(), rel=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_low_precision_tensor_passed_twice_is_one_tensor_after_the_cast(dtype):
    """kernel(x, x) is the one-sample case, which the kernels tell apart by identity: cast
    apart, the two copies made it two samples, with the bandwidth of [x; x] (0.03 off)."""
    x = torch.randn(12, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    for kernel in (GaussianMixtureKernel(), LaplaceKernel()):
        assert torch.equal(kernel(x, x), kernel(x))


def test_a_named_tuple_of_representations_is_cast_as_itself():
    """JRDHead's JRDRepresentations under bf16 autocast: the cast rebuilt the NamedTuple from
    one generator and raised a TypeError."""
    from kdml.kernels import GaussianMixtureKernel
    from kdml.models.heads import JRDHead
    from kdml.precision import upcast
    from kdml.regularizers import JointRepresentationSimilarity

    head = JRDHead(32, 16, 4)
    jrs = JointRepresentationSimilarity([GaussianMixtureKernel(3), GaussianMixtureKernel(3),
                                         GaussianMixtureKernel(1)])
    pooled, labels = torch.randn(12, 32, generator=torch.Generator().manual_seed(0)), \
        torch.arange(4).repeat(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        representations = head(pooled)
        value = jrs(representations, labels)
    cast = upcast(representations)
    assert type(cast) is type(representations)
    assert all(part.dtype == torch.float32 for part in cast)
    assert value.dtype == torch.float32
    assert float(value.detach()) == pytest.approx(float(jrs(cast, labels).detach()), rel=1e-6)


def test_maths_is_not_cast_down_by_autocast():
    x = torch.randn(16, 12, generator=torch.Generator().manual_seed(4))
    kernel = GaussianMixtureKernel(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = kernel(x)
        assert (x @ x.T).dtype == torch.bfloat16  # autocast is on ...
    assert inside.dtype == torch.float32  # ... but not inside the kernel
    assert torch.allclose(inside, kernel(x), atol=1e-6)


@pytest.mark.parametrize("squared", [False, True])
def test_triplet_distances_are_taken_in_float32_under_autocast(squared):
    """The triplet baseline's distance matrix was computed in bfloat16 under autocast, outside
    the float32 its loss is written for."""
    from kdml.models.backbones import MLP
    from kdml.training.recipes.atlas import (
        NormalizedTripletParams,
        TripletMethod,
        batch_all_triplet_loss,
    )

    torch.manual_seed(0)
    params = NormalizedTripletParams(squared_distance=squared)
    method = TripletMethod(MLP(6), params)
    inputs = torch.randn(12, 6, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(12) % 3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = method(inputs, labels)
    batch = out.embeddings.detach().double()
    expected = (batch[:, None] - batch[None, :]).pow(2).sum(-1)
    expected = expected if squared else expected.sqrt()
    loss, _ = batch_all_triplet_loss(expected, labels, params.margin)
    assert float(out.loss.detach()) == pytest.approx(float(loss), rel=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_jrd_trains_under_autocast_and_keeps_float32_parameters(tmp_path, monkeypatch,
                                                                precision):
    """Guards that the training forward runs under autocast in the configured dtype and that
    float16 (only) saves a live loss scaler's state."""
    seen = []  # (autocast on, its dtype, the backbone's output dtype) per training forward

    def record(module, inputs, output):
        if module.training:  # the evaluation's embedding passes run in eval mode
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                         output.dtype))

    def hooked_backbone(*args, **kwargs):
        backbone = build_backbone(*args, **kwargs)
        backbone.register_forward_hook(record)
        return backbone

    monkeypatch.setattr(build, "build_backbone", hooked_backbone)
    out = tmp_path / "run"
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(out), "--no-progress",
                     f"train.precision={precision}", "train.epochs=1", "eval.nmi=false",
                     "train.steps_per_epoch=3", "data.batch_size=20",
                     "model.embedding_size=16", "train.device=cpu"]) == 0
    dtype = AUTOCAST_DTYPES[precision]
    assert seen and set(seen) == {(True, dtype, dtype)}
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert bool(state["scaler"]) == (precision == "fp16")  # a disabled scaler saves {}
    dtypes = {value.dtype for value in state["method"].values() if value.is_floating_point()}
    assert dtypes == {torch.float32}  # PML casts its proxies to the input dtype otherwise
    run = json.loads((out / "metrics.json").read_text())
    assert 0.5 < run["final"]["recall@1"] <= 1.0
    assert torch.isfinite(torch.tensor(run["epochs"][0]["train/regularizer"]))


def test_an_fp16_epoch_of_skipped_steps_does_not_warn_about_the_schedule(tmp_path, capsys):
    """An epoch of one step whose scaled gradients overflow: the scaler skips the optimizer's
    step, and torch's "lr_scheduler.step() before optimizer.step()" warning had reached the
    user. Raised from kdml's trainer, kdml shows it as its own warning (stderr and train.log),
    not as a Python warning."""
    import warnings

    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                         "--no-progress", "train.precision=fp16", "train.epochs=1",
                         "train.steps_per_epoch=1", "data.batch_size=20",
                         "data.samples_per_class=4", "model.embedding_size=8",
                         "eval.nmi=false", "train.device=cpu"]) == 0
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert state["scaler"]["scale"] == 2.0**15  # halved from 2**16: its one step was skipped
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    assert "lr_scheduler.step()" not in capsys.readouterr().err
    assert "lr_scheduler.step()" not in (out / "train.log").read_text()


def test_a_resumed_fp16_run_goes_on_with_its_checkpoint_s_loss_scale(tmp_path):
    """--resume restores the float16 loss scaler with the model and the optimizer: a fresh
    scaler (scale 65536) would skip steps again to find a scale the run had found already."""
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", "train.precision=fp16", "train.epochs=1",
                     "train.steps_per_epoch=1", "data.batch_size=20", "eval.nmi=false",
                     "model.embedding_size=8", "train.device=cpu"]) == 0
    last = out / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=True)
    state["scaler"]["scale"] = 8.0  # as if the run had backed off to it
    torch.save(state, last)
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["train"]["epochs"] = 2
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    resumed = torch.load(last, weights_only=True)
    assert resumed["epoch"] == 2 and resumed["scaler"]["scale"] <= 8.0  # grows after 2000


@pytest.mark.parametrize(("precision", "device", "expected"), [
    ("bf16", "cpu", "fp32"),     # 12-15x faster than CPU autocast here
    ("fp16", "cpu", "fp32"),
    ("bf16", "cuda", "bf16"),    # on a GPU: as it trains
    ("fp16", "cuda:0", "fp16"),
    ("fp32", "cuda", "fp32"),
])
def test_a_run_embeds_in_its_precision_on_a_gpu_and_in_float32_on_a_cpu(precision, device,
                                                                       expected):
    from kdml.precision import embedding_precision

    assert embedding_precision(precision, torch.device(device)) == expected


def _bf16_run(tmp_path, monkeypatch=None, steps=3):
    """A bf16 run trained on the CPU for ``steps`` steps; with ``monkeypatch``, the autocast of
    every forward pass of its model in eval mode (its scoring) is recorded in the list
    returned second."""
    scoring = []

    def record(module, inputs, output):
        if not module.training:
            scoring.append(torch.is_autocast_enabled("cpu"))

    def hooked_backbone(*args, **kwargs):
        backbone = build_backbone(*args, **kwargs)
        backbone.register_forward_hook(record)
        return backbone

    if monkeypatch is not None:
        monkeypatch.setattr(build, "build_backbone", hooked_backbone)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     "--no-progress", "train.precision=bf16", "train.device=cpu",
                     "train.epochs=1", f"train.steps_per_epoch={steps}",
                     "data.batch_size=20", "data.samples_per_class=4", "model.embedding_size=8",
                     "eval.nmi=false"]) == 0  # few steps: CPU autocast is slow, and read alone
    return out, scoring


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """One _bf16_run with its scoring recorded, shared by the tests that only read the run
    (each works on a copy of it)."""
    with pytest.MonkeyPatch.context() as patch:
        return _bf16_run(tmp_path_factory.mktemp("bf16"), patch)


def test_a_bf16_run_scores_in_float32_on_the_cpu_in_training_and_in_kdml_eval(
        tmp_path, bf16_run):
    """Training scored in bf16 autocast, 12 to 15 times slower than float32 here; so would
    kdml eval & co. (it read a GPU run on a CPU in bf16). One rule for both keeps kdml eval's
    scores training's."""
    import shutil

    from kdml.training.loading import load_model, load_run

    shared, scoring = bf16_run
    run = tmp_path / "run"
    shutil.copytree(shared, run)  # kdml eval writes eval.json into it
    assert scoring and not any(scoring)
    assert cli.main(["eval", str(run), "--no-progress"]) == 0
    trained, evaluated = (json.loads((run / name).read_text())
                          for name in ("metrics.json", "eval.json"))
    assert evaluated["metrics"] == trained["final"]
    assert load_run(run).embedder.precision == "fp32"
    assert load_model(run).embedder.precision == "fp32"


def test_a_query_is_embedded_under_the_autocast_of_the_index_s_items(tmp_path, bf16_run):
    """kdml search had embedded image and 'inputs' queries in float32 whatever the items'
    autocast: 5e-3 away from the same items of a bf16 run here."""
    import dataclasses
    import shutil

    import numpy as np

    from kdml.inspection.parts import embed_part, run_part
    from kdml.inspection.queries import _embedded_queries
    from kdml.training.loading import load_run

    run = tmp_path / "run"
    shutil.copytree(bf16_run[0], run)
    loaded = load_run(run)
    loaded.embedder = dataclasses.replace(loaded.embedder, precision="bf16")  # a GPU's
    items = embed_part(loaded, run_part(loaded))
    test = loaded.splits.test
    inputs = torch.stack([test.load(int(i)) for i in items["positions"][:50]])
    queries, _ = _embedded_queries(loaded, inputs)
    np.testing.assert_allclose(queries, items["embeddings"][:50], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("kernels", "warned"), [(False, True), (True, False), (None, False)])
def test_mixed_precision_on_a_cpu_without_kernels_for_it_is_said_to_be_slow(
        tmp_path, monkeypatch, kernels, warned):
    """A GPU config trained on a laptop took 3 to 12 times float32's time a step, silently.
    Said where torch reports no kernels for the precision, not where it cannot say."""
    from kdml.training import trainer

    asked = []
    monkeypatch.setattr(trainer, "cpu_has_kernels_for",
                        lambda precision: asked.append(precision) or kernels)
    run, _ = _bf16_run(tmp_path, steps=1)  # said as training starts
    said = "train.precision=bf16 on a CPU for which torch has no bfloat16 kernels"
    assert (said in (run / "train.log").read_text()) is warned
    assert asked == ["bf16"]


def test_torch_says_whether_this_cpu_has_kernels_for_a_precision():
    from kdml.precision import cpu_has_kernels_for

    assert cpu_has_kernels_for("bf16") in (True, False)  # the probe is still in torch
    assert cpu_has_kernels_for("fp16") in (True, False)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_closed_form_fit_on_a_cpu_says_its_precision_is_not_read(tmp_path, monkeypatch,
                                                                   precision):
    """pca with train.precision=bf16 on a CPU had been told that its "training steps took 3
    to 12 times float32's time" and that "train.precision=fp32 is faster here": it has no
    training steps (its fit takes no autocast) and a CPU scores in float32, so the setting
    changes nothing there. It is warned of as a setting the run does not read."""
    from kdml.training import trainer

    monkeypatch.setattr(trainer, "cpu_has_kernels_for", lambda precision: False)
    out = tmp_path / "run"
    assert cli.main(["train", "pca", "--dataset", "mnist5k->digits", "--out", str(out),
                     "--no-progress", f"train.precision={precision}", "train.device=cpu",
                     "eval.nmi=false"]) == 0
    log = (out / "train.log").read_text()
    assert "kernels" not in log and "faster" not in log, log
    assert ("train.precision is not read by this run: pca is fitted in closed form, in no "
            "training steps, and on a CPU its scoring runs in float32") in log
