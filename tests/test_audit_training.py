"""The training loop's numbers and its parts' refusals, from a mutation audit of
kdml.training (trainer, build, recorder, domain_adapted): each test failed on a mutant that
every other test let pass."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from kdml import cli
from kdml.config import resolve_config
from kdml.data.prepare import prepare_data
from kdml.errors import KdmlError
from kdml.kernels import GaussianMixtureKernel
from kdml.models.method import Method, StepOutput
from kdml.regularizers.domain import DomainMMD
from kdml.training.domain_adapted import DomainAdaptedMethod
from kdml.training.recipes import get_recipe

TINY = ["train.epochs=2", "data.batch_size=40", "model.embedding_size=8", "eval.nmi=false",
        "--no-progress", "train.device=cpu", "train.steps_per_epoch=1"]


def config_of(recipe, *overrides):
    spec = get_recipe(recipe)
    return resolve_config(spec.name, spec.params, spec.defaults, None,
                          ["train.device=cpu", "model.embedding_size=8", "eval.nmi=false",
                           "model.backbone=mlp", "data.num_workers=0", *overrides])


def session_of(*overrides):
    from kdml.training.trainer import Session
    return Session.build(config_of("amsoftmax", "data.batch_size=20", *overrides),
                         echo=lambda line: None)


# ------------------------------------------------------------------ build_optimizer


@pytest.mark.parametrize("name", ["sgd", "adam", "rmsprop"])
def test_each_parameter_group_keeps_its_own_rate_and_weight_decay(name):
    """optim.lr (backbone), optim.head_lr (layers on top) and optim.proxy_lr (proxies, no
    weight decay) reach the optimiser's groups; handing it the parameters alone (every group
    at optim.lr, or torch's default, and no weight decay) had passed every test."""
    from kdml.training.build import build_method, build_optimizer

    config = config_of("amsoftmax", f"optim.name={name}", "optim.lr=0.01",
                       "optim.head_lr=0.02", "optim.proxy_lr=0.03", "optim.weight_decay=0.001")
    method = build_method(config, prepare_data(config.data), pretrained=False,
                          echo=lambda line: None)
    optimizer, _ = build_optimizer(method, config)
    wanted = [group for group in method.param_groups(config.optim) if group["params"]]
    assert len(wanted) >= 2  # the backbone and the proxies at least
    got = [(group["lr"], group["weight_decay"], [id(p) for p in group["params"]])
           for group in optimizer.param_groups]
    assert got == [(group["lr"], group["weight_decay"], [id(p) for p in group["params"]])
                   for group in wanted]
    assert {group["lr"] for group in optimizer.param_groups} >= {0.01, 0.03}
    assert optimizer.param_groups[-1]["weight_decay"] == 0.0  # the proxies'
    assert optimizer.param_groups[0]["weight_decay"] == 0.001


@pytest.mark.parametrize(("head_lr", "rates"), [("0.02", [0.01, 0.02]), ("0", [0.01, 0.01])])
def test_the_layers_on_top_of_the_backbone_train_at_optim_head_lr(head_lr, rates):
    """MTriplet's chart heads are neither the backbone nor proxies: they train at
    optim.head_lr, or optim.lr where it is 0. Training them at optim.lr whatever optim.head_lr
    said had passed every test (the test above has no head to train: amsoftmax's backbone and
    proxies are all it has)."""
    from kdml.training.build import build_method, build_optimizer

    config = config_of("mtriplet", "optim.lr=0.01", f"optim.head_lr={head_lr}",
                       "method.n_charts=2", "method.dim=4")
    method = build_method(config, prepare_data(config.data), pretrained=False,
                          echo=lambda line: None)
    optimizer, _ = build_optimizer(method, config)
    assert [group["lr"] for group in optimizer.param_groups] == rates
    head = {id(p) for p in optimizer.param_groups[1]["params"]}
    assert head and not head & {id(p) for p in method.backbone.parameters()}


def test_build_method_refuses_domain_beta_without_a_domain_pair():
    """build_method's own refusal (the library's callers, not only `kdml train`, whose later
    checks say it too)."""
    from kdml.training.build import build_method

    config = config_of("amsoftmax", "domain.beta=1")
    with pytest.raises(KdmlError, match="domain.beta > 0 needs a domain pair"):
        build_method(config, prepare_data(config.data), pretrained=False,
                     echo=lambda line: None)


@pytest.mark.parametrize(("kernel", "kind"), [("linear", type(None)),
                                             ("gaussian", GaussianMixtureKernel)])
def test_build_method_weighs_the_domain_term_by_domain_beta(kernel, kind):
    """domain.beta and domain.kernel reach the DomainAdaptedMethod the build wraps the
    recipe's method in: L = L_inner + beta * D_ts with the configured MMD (a beta of 1 whatever
    the setting trained another objective, and the tests' domain.beta=1 could not tell)."""
    from kdml.training.build import build_method_for

    config = config_of("amsoftmax", "data.dataset=digits", "domain.beta=0.3",
                       f"domain.kernel={kernel}")
    train = prepare_data(config.data).train
    method = build_method_for(config, train, 5, pretrained=False, echo=lambda line: None)
    assert isinstance(method, DomainAdaptedMethod) and method.beta == 0.3
    assert isinstance(method.mmd.kernel, kind)
    source, target = train.x[:12].float(), train.x[12:21].float() + 1.0
    output = method(source, torch.as_tensor(train.labels[:12]) % 5, target_inputs=target)
    assert output.loss.item() == pytest.approx(
        float(output.terms["inner_loss"]) + 0.3 * float(output.terms["d_ts"]), rel=1e-6)


def test_build_embedder_takes_the_precision_it_is_given():
    from kdml.data.transforms import InputPipeline
    from kdml.training.build import build_embedder

    config = config_of("amsoftmax")
    assert build_embedder(config, InputPipeline(), torch.device("cpu"),
                          precision="bf16").precision == "bf16"
    assert build_embedder(config, InputPipeline(), torch.device("cpu")).precision == "fp32"


def test_file_decoded_images_are_cropped_to_image_size_and_arrays_are_not(tmp_path):
    """Image files (resized to data.resize) are cropped to data.image_size, the side the
    backbone is built for, with random crops in training; building the pipeline without the
    crop (the model then saw whole resized images, unaugmented) had passed every test."""
    import types

    from fixtures_array_sets import make_image_folder

    from kdml.training.build import build_pipeline, model_input_shape

    folder = make_image_folder(tmp_path, classes=4, per_class=3, size=28)
    config = config_of("amsoftmax", f"data.dataset=folder:{folder}", "data.resize=28",
                       "data.image_size=24", "data.batch_size=4", "eval.ks=[1]")
    samples = prepare_data(config.data).train
    plain = types.SimpleNamespace(backbone=None, augments_inputs=False)
    pipeline = build_pipeline(config, samples, plain)
    assert pipeline.crop_size == 24 and pipeline.augment is not None
    assert model_input_shape(config, samples) == (3, 24, 24)
    arrays = config_of("amsoftmax")
    assert build_pipeline(arrays, prepare_data(arrays.data).train, plain).crop_size is None


# ------------------------------------------------------------------ train_one_epoch


def test_each_epoch_term_is_the_float64_mean_of_its_steps():
    """Every term's epoch value is the mean over the steps, summed in float64 as Python floats
    would be: keeping the last step's value, or summing in float32, had passed every test."""
    from kdml.training.trainer import train_one_epoch

    session = session_of("train.steps_per_epoch=3")
    steps: list[dict[str, float]] = []
    session.model.register_forward_hook(
        lambda module, inputs, output: steps.append(
            {name: float(value) for name, value in output.terms.items()}))
    means = train_one_epoch(session, 1, progress=False)
    assert len(steps) == 3
    assert len({row["loss"] for row in steps}) == 3  # the steps' losses differ
    assert set(means) == set(steps[0])
    for name in means:
        total = 0.0
        for row in steps:
            total += row[name]
        assert means[name] == pytest.approx(total / 3, rel=1e-15, abs=0.0), name


def test_an_epoch_trains_the_method_in_training_mode_after_it_was_scored():
    """Scoring leaves the method in eval mode: each epoch sets it back to training mode
    (BatchNorm statistics, dropout); not doing so had passed every test."""
    from kdml.training.trainer import train_one_epoch

    session = session_of("train.steps_per_epoch=2")
    session.method.eval()  # as the scoring of the epoch before leaves it
    modes: list[bool] = []
    session.model.register_forward_hook(
        lambda module, inputs, output: modes.append(
            all(part.training for part in module.modules())))
    train_one_epoch(session, 2, progress=False)
    assert modes == [True, True]


def test_each_step_draws_its_augmentation_and_its_method_s_draws_from_its_own_streams():
    """Step k of epoch e draws from (train.seed, e, k): its augmentation from the AUGMENT
    stream, the method's own draws (prior samples, views) from the StepRandom it is handed.
    Every step of an epoch drawing step 0's numbers, or the augmentation drawing the method's
    stream, had passed every test (the resumed-run tests compare runs that both drew so)."""
    from kdml.seeding import AUGMENT, METHOD, StepRandom
    from kdml.training.trainer import train_one_epoch

    session = session_of("train.steps_per_epoch=2", "train.seed=5")
    augment_seeds: list[int] = []
    real_train = session.pipeline.train

    def train(inputs, generator, share=None):
        augment_seeds.append(generator.initial_seed())
        return real_train(inputs, generator, share)

    session.pipeline.train = train
    positions = []
    session.model.register_forward_pre_hook(
        lambda module, args, kwargs: positions.append(kwargs["rng"].keys), with_kwargs=True)
    train_one_epoch(session, 3, progress=False)
    assert positions == [(5, 3, 0, 0), (5, 3, 1, 0)]
    assert augment_seeds == [StepRandom(5, 3, step).seed(AUGMENT) for step in (0, 1)]
    assert len({StepRandom(5, 3, 0).seed(stream) for stream in (AUGMENT, METHOD)}) == 2


def test_each_epoch_draws_its_own_batches_and_draws_them_again_alike():
    """TrainingBatches.epoch(e) draws from (train.seed, e): another epoch, other batches; the
    same epoch again (a resumed run), the same ones; train.steps_per_epoch of them. Every
    epoch drawing epoch 1's batches, or train.steps_per_epoch read nowhere, had passed every
    test."""
    session = session_of("train.steps_per_epoch=2", "data.samples_per_class=4")

    def drawn(epoch):
        return torch.cat([torch.as_tensor(batch.inputs).flatten()
                          for batch, _ in session.batches.epoch(epoch)])

    first, second = drawn(1), drawn(2)
    assert len(first) == len(second) and not torch.equal(first, second)
    assert torch.equal(drawn(2), second) and torch.equal(drawn(1), first)
    assert len(list(session.batches.epoch(1))) == 2


def test_each_epoch_counts_the_samples_it_left_out_afresh():
    """TrainingBatches.left_out is the epoch's own (unreadable/train of its row): counts kept
    from the epoch before (here 5 drawn, none trained) had passed every test."""
    session = session_of("train.steps_per_epoch=2")
    session.batches.drawn, session.batches.trained = 5, 0
    assert len(list(session.batches.epoch(2))) == 2
    assert session.batches.left_out == 0 and session.batches.drawn == 40


def test_an_epoch_without_a_batch_is_one_kdml_error(monkeypatch):
    from kdml.training.trainer import train_one_epoch

    session = session_of("train.steps_per_epoch=2")
    monkeypatch.setattr(session.batches, "epoch", lambda epoch: iter(()))
    with pytest.raises(KdmlError, match=r"^epoch 3 had no training batch"):
        train_one_epoch(session, 3, progress=False)


def test_restore_gives_back_the_loss_scalers_state(tmp_path):
    """train.precision=fp16 keeps its loss scale in the checkpoint; a resumed session starts
    from it, not from torch's 65536 (dropping it had passed every test)."""
    first = session_of("train.precision=fp16")
    assert first.scaler.is_enabled()
    state = first.checkpoint(1, [], False)
    state["scaler"] = {**state["scaler"], "scale": 8.0, "_growth_tracker": 3}
    second = session_of("train.precision=fp16")
    assert second.scaler.get_scale() != 8.0
    second.restore(state, tmp_path / "last.pt")
    assert second.scaler.get_scale() == 8.0
    assert second.scaler.state_dict()["_growth_tracker"] == 3


def test_a_checkpoint_keeps_the_test_images_its_last_scoring_left_out():
    """Session.checkpoint records DataSplits.unreadable, which a finished run resumed counts
    its metrics' samples by (recorded_unreadable reads it back); writing none had passed every
    test (they build the checkpoint's record by hand)."""
    session = session_of()
    session.splits.unreadable = {"test": torch.tensor([1, 3])}
    state = session.checkpoint(2, [{"epoch": 1}], False)
    assert {part: positions.tolist() for part, positions in state["unreadable"].items()} == {
        "test": [1, 3]}
    assert (state["epoch"], state["history"], state["finished"]) == (2, [{"epoch": 1}], False)


# ------------------------------------------------------------------ whole runs


def _scoring_fails_at(monkeypatch, failing: int) -> None:
    """Make the trainer's scoring raise a KdmlError (as an unreadable test image does) at its
    ``failing``-th call."""
    from kdml.training import trainer

    real, calls = trainer.score_method, []

    def scoring(*args, **kwargs):
        calls.append(1)
        if len(calls) == failing:
            raise KdmlError("cannot decode image x.jpg; replace or remove it")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "score_method", scoring)


def test_an_unscored_epoch_beyond_epochs_lowered_since_is_scored(tmp_path, monkeypatch):
    """Epoch 2 trained, its scoring stopped; train.epochs then lowered to 1: --resume scores
    epoch 2 (the trained epoch is not lost). Ending at train.epochs had dropped it and ended
    with epoch 1's metrics, passing every test."""
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        _scoring_fails_at(patched, 2)
        assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                         *TINY]) == 2
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == [
        "last.pt", "unscored.pt"]
    config = out / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    settings["train"]["epochs"] = 1
    config.write_text(yaml.safe_dump(settings))
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2]
    assert metrics["final"]["recall@1"] == metrics["epochs"][1]["test/recall@1"]
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 2


def test_metrics_json_holds_each_finished_epoch_before_the_run_ends(tmp_path, stop_in_epoch):
    """A run stopped in epoch 2 has epoch 1's row in metrics.json (written every epoch, not
    only at the end; writing it only at the end had passed every test)."""
    stop_in_epoch(2)
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                     *TINY]) == 130
    metrics = json.loads((out / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == [1]
    assert "test/recall@1" in metrics["epochs"][0]


# ------------------------------------------------------------------ DomainAdaptedMethod


class Inner(Method):
    """A tiny inner method that records the ``rng`` it is called with."""

    has_charts = True
    augments_inputs = True

    def __init__(self, embeddings: bool = True) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 3).double()
        with torch.no_grad():  # fixed weights: the tests draw nothing from torch's global RNG
            self.backbone.weight.copy_(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))
            self.backbone.bias.fill_(0.1)
        self.returns_embeddings = embeddings
        self.rngs: list[object] = []

    def forward(self, inputs, labels, target_inputs=None, *, rng=None):
        self.rngs.append(rng)
        embeddings = self.backbone(inputs)
        loss = embeddings.pow(2).mean()
        return StepOutput(loss, {"loss": loss.detach()},
                          embeddings if self.returns_embeddings else None)

    def embed(self, inputs):
        return self.backbone(inputs)

    def chart_codes(self, inputs):
        return torch.zeros(len(inputs), dtype=torch.long)


@pytest.mark.parametrize("beta", [math.nan, -0.5, math.inf, "1", True, None])
def test_a_domain_weight_that_is_not_a_number_at_least_0_is_refused(beta):
    """NaN, infinity (a loss of inf, or NaN where the discrepancy is 0) and non-numbers (a
    TypeError from the comparison) are refused in one line, as negative weights are."""
    with pytest.raises(KdmlError,
                       match=r"^DomainAdaptedMethod: beta must be a finite number >= 0, got "):
        DomainAdaptedMethod(Inner(), beta, DomainMMD())


@pytest.mark.parametrize("beta", [0, 0.0, 2, torch.tensor(0.5), np.float64(3.0)])
def test_a_domain_weight_of_any_real_kind_is_taken_as_a_float(beta):
    method = DomainAdaptedMethod(Inner(), beta, DomainMMD())
    assert type(method.beta) is float and method.beta == float(beta)


def test_an_inner_method_without_embeddings_is_refused_in_one_line():
    method = DomainAdaptedMethod(Inner(embeddings=False), 1.0, DomainMMD())
    source = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(KdmlError, match="returns no embeddings; it cannot be domain-adapted"):
        method(source, torch.tensor([0, 0, 1, 1]), target_inputs=source + 1)


def test_the_domain_adapted_method_passes_on_the_step_random_and_the_inner_flags():
    """The step's ``rng`` reaches the inner method (its augmentations draw from the run's
    seed), and its charts and own augmentation stay its own: dropping either had passed every
    test."""
    from kdml.seeding import StepRandom

    inner = Inner()
    method = DomainAdaptedMethod(inner, 1.0, DomainMMD())
    assert method.has_charts and method.augments_inputs
    rng = StepRandom(0, 1, 0)
    source = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    method(source, torch.tensor([0, 0, 1, 1]), target_inputs=source + 1, rng=rng)
    assert inner.rngs == [rng]


def test_a_loss_that_is_not_finite_stops_a_cpu_epoch_at_its_step():
    """On a CPU the non-finite check runs every step: the step whose loss is NaN stops the
    epoch before its update and before the next step (checking every 50 steps, as on a GPU,
    had passed every test)."""
    from kdml.training.nonfinite import NonFiniteLoss
    from kdml.training.trainer import train_one_epoch

    session = session_of("train.steps_per_epoch=3")
    before = {key: value.detach().clone() for key, value in session.method.named_parameters()}
    calls: list[int] = []

    def nan_loss(module, inputs, output):
        calls.append(1)
        nan = torch.tensor(float("nan"))
        return StepOutput(output.loss * nan, {**output.terms, "loss": output.terms["loss"] * nan},
                          output.embeddings)

    session.model.register_forward_hook(nan_loss)
    with pytest.raises(NonFiniteLoss, match="NaN or infinite"):
        train_one_epoch(session, 1, progress=False)
    assert calls == [1]
    assert all(torch.equal(value, before[key])  # no update with the NaN loss
               for key, value in session.method.named_parameters())


@pytest.mark.parametrize(("backbone", "named"), [("cnn", "cnn"), ("bninception", None),
                                                 ("timm:resnet18", None)])
def test_only_a_backbone_pooling_does_not_reach_is_named(backbone, named):
    """model.pooling reaches the ImageNet backbones' pooling: it is named as unused for kdml's
    own backbones only (naming none, or every backbone, had passed every test)."""
    import types

    from kdml.training.trainer import Session

    config = config_of("amsoftmax", f"model.backbone={backbone}", "model.pooling=max")
    session = types.SimpleNamespace(
        config=config, splits=types.SimpleNamespace(train=types.SimpleNamespace(
            default_backbone="mlp")))
    assert Session.unpooled_backbone(session) == named
    config.model.pooling = "avg"  # the default: nothing to name
    assert Session.unpooled_backbone(session) is None


def test_an_epoch_that_converged_while_it_was_scored_ends_the_resumed_run(tmp_path,
                                                                          monkeypatch):
    """train.tolerance ends the run at epoch 2; a kill while epoch 2 is scored keeps that in
    unscored.pt, and --resume scores it and stops there, as the uninterrupted run does
    (resuming it as not converged had trained on and passed every test)."""
    from kdml.training import trainer

    real, calls = trainer.score_method, []

    def killed_at_the_second_scoring(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    out = tmp_path / "run"
    settings = ["train.epochs=5", "train.tolerance=1e9"]
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "score_method", killed_at_the_second_scoring)
        assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                         *TINY, *settings]) == 130
    assert (out / "checkpoints" / "unscored.pt").exists()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2]
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert (state["epoch"], state["finished"], state["stopped_early"]) == (2, True, True)


def test_a_fitted_run_resumes(tmp_path, capsys):
    """A closed-form run (PCA) has no optimiser to restore: --resume of it says all is done
    (restoring an optimiser it does not have had refused it as another run's checkpoint)."""
    out = tmp_path / "run"
    assert cli.main(["train", "pca", "--dataset", "mnist5k->digits", "--out", str(out),
                     *TINY]) == 0
    before = json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert "error" not in capsys.readouterr().err
    assert json.loads((out / "metrics.json").read_text()) == before


def domain_pair_session(tmp_path):
    """A session of a small source/target npz (24 samples of 4 classes each), batches of 8,
    2 steps an epoch."""
    rng = np.random.default_rng(0)
    features = tmp_path / "features.npz"
    np.savez(features, X=rng.standard_normal((48, 6)).astype(np.float32),
             y=np.repeat(np.arange(8), 6) % 4,
             domain=np.array(["source"] * 24 + ["target"] * 24))
    return session_of(f"data.dataset=npz:{features}", "domain.beta=1", "data.batch_size=8",
                      "data.samples_per_class=2", "train.steps_per_epoch=2", "eval.ks=[1]")


def test_the_target_batch_goes_through_the_test_pipeline(tmp_path):
    """The target domain's batch is embedded as the test inputs are (no augmentation, the
    test crop and normalisation): sending it through the training augmentation had passed
    every test (array data has no augmentation, so the two look alike there)."""
    import types

    from kdml.training.trainer import train_one_epoch

    session = domain_pair_session(tmp_path)
    real = session.pipeline
    session.pipeline = types.SimpleNamespace(
        train=lambda inputs, generator, share=None: real.train(inputs, generator, share),
        test=lambda inputs: real.test(inputs) + 1000.0)
    seen: list[float] = []
    session.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(float(kwargs["target_inputs"].min())),
        with_kwargs=True)
    train_one_epoch(session, 1, progress=False)
    assert len(seen) == 2 and min(seen) > 500.0


def test_each_epoch_draws_its_own_target_batches(tmp_path):
    """The target domain's batches are drawn from (train.seed, epoch) as the source's are:
    every epoch drawing the same target batches had passed every test."""
    session = domain_pair_session(tmp_path)

    def targets(epoch):
        return torch.cat([torch.as_tensor(target.inputs).flatten()
                          for _, target in session.batches.epoch(epoch)])

    first, second = targets(1), targets(2)
    assert not torch.equal(first, second) and torch.equal(targets(1), first)


def test_the_domain_adapted_loss_term_is_the_whole_loss():
    """``terms["loss"]`` (train/loss, which train.tolerance reads) is the inner loss plus
    beta times the discrepancy, not the inner method's own ``loss`` term, which is kept as
    ``inner_loss``; letting the inner term win had passed every test."""
    method = DomainAdaptedMethod(Inner(), 2.0, DomainMMD())
    source = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    output = method(source, torch.tensor([0, 0, 1, 1]), target_inputs=source + 1)
    d_ts, inner_loss = float(output.terms["d_ts"]), float(output.terms["inner_loss"])
    assert d_ts > 0
    assert float(output.terms["loss"]) == pytest.approx(inner_loss + 2.0 * d_ts, rel=1e-12)
    assert float(output.terms["loss"]) == output.loss.item()


def test_the_method_has_one_proxy_per_training_class():
    from kdml.training.build import build_method

    config = config_of("amsoftmax")
    splits = prepare_data(config.data)
    method = build_method(config, splits, pretrained=False, echo=lambda line: None)
    (proxies,) = method.proxy_parameters()
    assert proxies.numel() == config.model.embedding_size * len(splits.train_classes)


def test_a_run_stopped_by_train_tolerance_says_so_where_it_is_watched(tmp_path, capsys):
    """A run of 5 epochs that the convergence rule (DTML's |J_k - J_(k-1)| < eps) stops after
    2 had said why in train.log only: the console showed the final table as if it had run its
    5. A fitted run (PCA), which has nothing to train after its fit, says nothing of it."""
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out), *TINY,
                     "train.epochs=5", "train.tolerance=1e9"]) == 0
    assert ("stopped after epoch 2 of 5: the training loss changed by less than "
            "train.tolerance=1e+09\n") in capsys.readouterr().out
    assert cli.main(["train", "pca", "--dataset", "mnist5k->digits", "--out",
                     str(tmp_path / "pca"), *TINY, "train.epochs=3"]) == 0
    assert "stopped after" not in capsys.readouterr().out
