"""Audit of what feeds a training step: the run's record of its samples (kdml.data.sample_spec),
SimCLR's augmentation (kdml.data.augment), mixed precision (kdml.precision) and the training
batches (kdml.training.batches). Each test names what a plausible bug, a hand-made mutant of
that code, would have changed without any other test failing.
"""

from __future__ import annotations

import pytest
import torch

from kdml.config import RunConfig
from kdml.data.augment import SimCLRAugment
from kdml.data.dataset import ArrayDataset
from kdml.data.sample_spec import FIELD, SampleSpec
from kdml.data.samplers import ClassBalancedBatches, ShuffledBatches
from kdml.data.splits import DataSplits
from kdml.distributed import World
from kdml.errors import KdmlError
from kdml.precision import autocast, cpu_has_kernels_for, full_precision, gradient_scaler
from kdml.training.batches import TrainingBatches

# ----------------------------------------------------------------- the record of the samples


def _record(**changes):
    record = {"sample_shape": [1, 8, 8], "is_file_backed": False, "holds_pixels": True,
              "float_dtype": "float32", "default_backbone": "cnn", "train_classes": 5}
    return {FIELD: {**record, **changes}}


def test_a_record_round_trips_through_to_record_and_from_record():
    spec = SampleSpec((1, 8, 8), False, True, "float32", "cnn", 5)
    assert spec.to_record() == _record()[FIELD]
    assert SampleSpec.from_record({FIELD: spec.to_record()}, "data.json") == spec


@pytest.mark.parametrize(("changes", "words"), [
    ({"sample_shape": []}, "model_input.sample_shape is [], not a list of sizes"),
    ({"sample_shape": [True, 8]}, "model_input.sample_shape is [True, 8], not a list of sizes"),
    ({"sample_shape": [1, 8.0]}, "model_input.sample_shape is [1, 8.0], not a list of sizes"),
    ({"train_classes": True}, "model_input.train_classes is True, not a count"),
    ({"is_file_backed": 1}, "model_input.is_file_backed is 1, not true or false"),
    ({"default_backbone": 3}, "model_input.default_backbone is 3"),
    ({"extra": 1}, "its model_input is not kdml's record of the fields"),
])
def test_a_damaged_record_is_refused_in_one_line_not_a_traceback(changes, words):
    """An extra field had reached the dataclass (a TypeError traceback), and an empty shape or
    a bool size or count had been taken as a record."""
    with pytest.raises(KdmlError) as error:
        SampleSpec.from_record(_record(**changes), "run/data.json")
    text = str(error.value)
    assert text.startswith("run/data.json is damaged (") and words in text, text


def test_a_run_without_the_record_has_none():
    assert SampleSpec.from_record({}, "data.json") is None


# ----------------------------------------------------------------- SimCLR augmentation


@pytest.mark.parametrize("settings", [
    {"crop_scale": (0.0, 1.0)}, {"crop_scale": (0.5, 1.01)}, {"crop_scale": (-0.1, 0.5)},
    {"jitter_strength": 1.25}, {"jitter_strength": 2.0}, {"jitter_strength": -0.1},
    {"jitter_p": 1.01}, {"grayscale_p": 1.5}, {"grayscale_p": -0.01}, {"size": 0},
])
def test_augmentation_settings_past_their_range_are_refused(settings):
    with pytest.raises(KdmlError, match=next(iter(settings))):
        SimCLRAugment(**settings)


@pytest.mark.parametrize("settings", [
    {"crop_scale": (1e-6, 1.0)}, {"jitter_strength": 1.249}, {"jitter_strength": 0.0},
    {"jitter_p": 1.0, "grayscale_p": 1.0}, {"jitter_p": 0.0, "grayscale_p": 0.0}, {"size": 1},
])
def test_augmentation_settings_at_the_edge_of_their_range_are_taken(settings):
    SimCLRAugment(**settings)


def test_views_of_non_square_images_of_two_sizes_keep_their_shapes():
    """The crop is (height, width) per input shape: swapped sides, or a pipeline cached for one
    width reused for another, gave views of the wrong shape."""
    augment = SimCLRAugment()
    generator = torch.Generator().manual_seed(0)
    for shape in ((2, 1, 8, 12), (2, 1, 8, 6), (2, 3, 10, 4)):
        images = torch.rand(*shape, generator=generator)
        first, second = augment(images, torch.Generator().manual_seed(1))
        assert first.shape == second.shape == images.shape


def test_a_fixed_crop_size_gives_square_views():
    views = SimCLRAugment(size=5)(torch.rand(2, 1, 8, 12), torch.Generator().manual_seed(0))
    assert all(view.shape == (2, 1, 5, 5) for view in views)


def test_the_horizontal_flip_has_probability_one_half():
    flip = SimCLRAugment(horizontal_flip=True).pipeline(1, 8, 8)[1]
    assert type(flip).__name__ == "RandomHorizontalFlip" and flip.p == 0.5


@pytest.mark.parametrize("channels", [1, 3])
def test_the_views_steps_draw_from_the_documented_ranges(channels):
    """The class docstring's steps and ranges, read from 4,000 drawn parameters (no image is
    warped): crop areas within ``crop_scale`` at aspect ratios 3/4-4/3; brightness, contrast
    and (3 channels) saturation factors in [1 - 0.8 s, 1 + 0.8 s] and hue in [-0.2 s, 0.2 s],
    with probability ``jitter_p``; grayscale with probability ``grayscale_p``; no flip."""
    from kdml.data.transforms import draw_parameters

    s = 1.0
    augment = SimCLRAugment(crop_scale=(0.3, 0.6), jitter_strength=s, jitter_p=0.4,
                            grayscale_p=0.7)
    pipeline = augment.pipeline(channels, 32, 32)
    expected = ["RandomResizedCrop", "ColorJitter"] + ["RandomGrayscale"] * (channels == 3)
    assert [type(step).__name__ for step in pipeline] == expected
    params = draw_parameters(pipeline, torch.Size((4000, channels, 32, 32)),
                             torch.Generator().manual_seed(0))
    boxes = params[0].data["src"]
    width, height = (boxes[:, 2] - boxes[:, 0] + 1).double().unbind(1)
    area, ratio = width * height / 32 ** 2, width / height
    assert 0.27 <= area.min() < 0.33 and 0.55 < area.max() <= 0.65  # whole pixels: +-0.03
    assert ratio.min() >= 0.7 and ratio.max() <= 1.43  # 3/4-4/3, whole pixels
    jitter = params[1].data
    colour = ("brightness", "contrast") + ("saturation",) * (channels == 3)
    for name in colour:
        factor = jitter[f"{name}_factor"]
        assert 1 - 0.8 * s <= factor.min() < 0.25 and 1.75 < factor.max() <= 1 + 0.8 * s
    hue = jitter["hue_factor"]
    if channels == 3:
        assert -0.2 * s <= hue.min() < -0.19 and 0.19 < hue.max() <= 0.2 * s
    else:  # one channel: no saturation or hue
        assert torch.all(hue == 0) and torch.all(jitter["saturation_factor"] == 1)
    assert 0.37 < jitter["batch_prob"].float().mean() < 0.43
    if channels == 3:
        assert 0.67 < params[2].data["batch_prob"].float().mean() < 0.73


@pytest.mark.parametrize(("images", "words"), [
    (torch.zeros(2, 1, 8, 8, dtype=torch.uint8), "needs float images in [0, 1], got torch.uint8"),
    (torch.rand(2, 1, 8), "needs images [B, C, H, W] with 1 or 3 channels, got shape (2, 1, 8)"),
    (torch.rand(2, 3, 8, 8, 1), "needs images [B, C, H, W]"),
])
def test_images_the_augmentation_cannot_take_are_refused_in_one_line(images, words):
    with pytest.raises(KdmlError) as error:
        SimCLRAugment()(images)
    assert words in str(error.value)


# ----------------------------------------------------------------- mixed precision


def test_full_precision_casts_keyword_arguments_too():
    @full_precision
    def dtypes(x, *, y):
        return x.dtype, y.dtype

    low = torch.ones(2, dtype=torch.bfloat16)
    assert dtypes(low, y=torch.ones(2, dtype=torch.float16)) == (torch.float32, torch.float32)
    assert dtypes(low, y=torch.ones(2, dtype=torch.float64)) == (torch.float32, torch.float64)


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16),
                                                  ("fp16", torch.float16)])
def test_autocast_runs_in_the_precision_s_own_dtype(precision, dtype):
    with autocast(torch.device("cpu"), precision):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == dtype
    with autocast(torch.device("cpu"), "fp32"):
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize(("precision", "enabled"), [("fp16", True), ("bf16", False),
                                                    ("fp32", False)])
def test_only_float16_gets_a_live_gradient_scaler(precision, enabled):
    assert gradient_scaler(torch.device("cpu"), precision).is_enabled() is enabled


def test_each_precision_asks_its_own_probe(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False)
    assert cpu_has_kernels_for("bf16") is True
    assert cpu_has_kernels_for("fp16") is False


def test_a_probe_that_fails_inside_torch_says_nothing(monkeypatch):
    def fails():
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", fails)
    assert cpu_has_kernels_for("bf16") is None


# ----------------------------------------------------------------- training batches


def _config(batch_size: int, samples_per_class: int = 0, steps: int = 0,
            seed: int = 0) -> RunConfig:
    config = RunConfig(recipe="amsoftmax", method=None)
    config.data.batch_size, config.data.samples_per_class = batch_size, samples_per_class
    config.data.num_workers, config.train.steps_per_epoch = 0, steps
    config.train.seed = seed
    return config


def _splits(num_train: int = 12, num_target: int | None = None) -> DataSplits:
    train = ArrayDataset("s", "s", torch.randn(num_train, 2), torch.arange(num_train) % 3)
    if num_target is None:
        return DataSplits(train, train, [0, 1, 2])
    target = ArrayDataset("t", "t", torch.randn(num_target, 2), torch.zeros(num_target).long())
    return DataSplits(train, target, [0, 1, 2], kind="domain", target=target)


def _indices(batches: TrainingBatches, epoch: int, target: bool = False) -> list[list[int]]:
    return [(pair[1] if target else pair[0]).indices.tolist() for pair in batches.epoch(epoch)]


def test_full_batches_ignore_samples_per_class():
    """data.batch_size=0 is the whole split in one batch, with or without the class-balanced
    sampler's m."""
    batches = TrainingBatches(_config(0, samples_per_class=2), _splits(), False,
                              torch.device("cpu"))
    assert len(batches) == 1
    assert sorted(_indices(batches, 1)[0]) == list(range(12))


def test_a_method_that_draws_no_batches_reads_plain_ones():
    batches = TrainingBatches(_config(4, samples_per_class=2), _splits(), False,
                              torch.device("cpu"), drawn=False)
    assert type(batches.sampler) is ShuffledBatches
    assert sorted(sum(_indices(batches, 1), [])) == list(range(12))


def test_steps_per_epoch_beyond_the_split_s_batches_takes_them_all():
    batches = TrainingBatches(_config(4, steps=100), _splits(), False, torch.device("cpu"))
    assert len(batches) == 3 and len(_indices(batches, 1)) == 3


def test_steps_per_epoch_below_the_split_s_batches_stops_the_epoch_there():
    """train.steps_per_epoch=2 of 3 batches: an epoch is 2 steps."""
    batches = TrainingBatches(_config(4, steps=2), _splits(), False, torch.device("cpu"))
    assert len(batches) == 2 and len(_indices(batches, 1)) == 2


def test_the_batches_are_the_run_seed_s_and_change_with_the_epoch():
    """Every epoch drew epoch 0's batches, or another seed's, without a test failing."""
    batches = TrainingBatches(_config(4, seed=3), _splits(), False, torch.device("cpu"))
    for epoch in (1, 2):
        reference = ShuffledBatches(12, 4, seed=3)
        reference.set_epoch(epoch)
        assert _indices(batches, epoch) == list(reference)
    assert _indices(batches, 1) != _indices(batches, 2)
    assert _indices(batches, 1) == _indices(batches, 1)


def test_the_target_batches_change_with_the_epoch():
    batches = TrainingBatches(_config(4), _splits(num_target=40), True, torch.device("cpu"))
    first, second = _indices(batches, 1, target=True), _indices(batches, 2, target=True)
    assert [len(batch) for batch in first] == [4, 4, 4] and first != second
    assert first == _indices(batches, 1, target=True)


def test_a_target_larger_than_the_global_batch_need_not_split_over_the_processes():
    """A target of 9 samples is drawn 4 at a time: only the batch of 4 is shared out."""
    batches = TrainingBatches(_config(4), _splits(num_target=9), True, torch.device("cpu"),
                              World(rank=0, size=2))
    assert len(batches) == 3


def test_a_recipe_that_needs_a_target_domain_without_one_is_refused_in_one_line():
    with pytest.raises(KdmlError, match=r"^this recipe needs a target domain"):
        TrainingBatches(_config(4), _splits(), True, torch.device("cpu"))


def test_both_views_are_drawn_from_the_given_generator_alone():
    """The second view drawn from torch's global generator made a seeded step unrepeatable."""
    augment, images = SimCLRAugment(), torch.rand(4, 3, 8, 8, generator=torch.Generator())
    torch.manual_seed(0)
    first = augment(images, torch.Generator().manual_seed(5))
    torch.manual_seed(1)
    again = augment(images, torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_the_class_balanced_batches_are_the_run_seed_s():
    batches = TrainingBatches(_config(6, samples_per_class=2, seed=7), _splits(), False,
                              torch.device("cpu"))
    reference = ClassBalancedBatches(torch.arange(12) % 3, 2, 6, seed=7)
    reference.set_epoch(2)
    assert _indices(batches, 2) == list(reference)


@pytest.mark.parametrize("target", [False, True])
def test_the_ranks_shares_in_rank_order_are_the_global_batches(target):
    """Under torchrun each rank loads its own contiguous slice of the global source and target
    batches: shares swapped between ranks, or a target batch loaded whole on every rank, had
    passed the tests that build no process group."""
    def indices(world):
        batches = TrainingBatches(_config(4, seed=1), _splits(num_target=40), True,
                                  torch.device("cpu"), world)
        return _indices(batches, 3, target=target)

    whole = indices(World(rank=0, size=1))
    shares = [indices(World(rank=rank, size=2)) for rank in (0, 1)]
    assert [len(batch) for batch in shares[0]] == [2, 2, 2]
    assert [a + b for a, b in zip(*shares, strict=True)] == whole
