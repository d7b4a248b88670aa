"""Run configuration: plain dataclasses, filled from defaults, a YAML file and ``key=value``
overrides, and validated once at the edge (the CLI) with one-line errors.

Keys are dotted (``train.epochs``); a leaf name that is unique across sections may be used alone
(``epochs=3``). The ``method`` section holds the recipe's own hyperparameters, declared by the
recipe as a dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kdml.errors import KdmlError, check_no_nul_byte, home_expanded, why_missing
from kdml.file_write import write_through_new_file


@dataclass
class DataConfig:
    # a dataset name (see `kdml datasets`), folder:DIR, csv:FILE, a domain pair
    # "SOURCE->TARGET", or "npz:PATH" (features of two domains)
    dataset: str = "mnist5k"
    root: str = ""  # folder of an on-disk dataset; "" = searched in $KDML_DATA_ROOT, then system
    # standard (the dataset's own split; class-disjoint where it has none) | class-disjoint |
    # seen-holdout (ignored for domain pairs)
    split: str = "standard"
    train_classes: float = 0.5  # class-disjoint: fraction (or count) of the sorted classes
    holdout_fraction: float = 0.2  # seen-holdout: share of every class held out for testing
    # > 0: train on the rest of the training part and score this share of it instead of the
    # test part, for choosing hyperparameters (the last training classes where the test classes
    # are unseen, else this share of every class's samples)
    validation: float = 0.0
    batch_size: int = 64  # 0 = the whole training set in one batch
    samples_per_class: int = 0  # m of the class-balanced sampler; 0 = plain shuffled batches
    pca_dim: int = 0  # domain pairs: PCA fitted on the source only (0 = none)
    # loader processes; -1 = one per core (at most 8) for image files, under torchrun each
    # process's share of its machine's cores
    num_workers: int = -1
    resize: int = 256  # image files: short side after decoding (then a centred square)
    image_size: int = 224  # image files: side of the training and test crops
    on_bad_image: str = "error"  # an undecodable image file: error (stop) | skip (leave out)


@dataclass
class ModelConfig:
    # auto | cnn | mlp | conv1d | identity | bninception | timm:NAME | torchvision:NAME
    backbone: str = "auto"
    embedding_size: int = 64
    freeze_bn: bool = False  # keep BatchNorm statistics fixed (pretrained backbones)
    pooling: str = "avg"  # global pooling of the last feature map: avg | max | avg+max
    sync_bn: bool = False  # under torchrun on GPUs: BatchNorm statistics over the global batch
    small_input: bool = False  # timm/torchvision ResNets: 3x3 stride-1 stem, no max-pool
    weights: str = ""  # a local .pth or .safetensors state dict for the backbone


@dataclass
class OptimConfig:
    # Defaults for a small network trained from scratch on the offline data (the demo, the
    # tests); recipes override what their papers' setups need, configs/*.yaml hold the papers'
    # settings, and docs/recipes.md names each difference and its reason.
    name: str = "adam"  # adam | sgd (plain gradient steps, as in DTML) | rmsprop
    lr: float = 1e-3  # the backbone
    head_lr: float = 0.0  # the layers on top of the backbone; 0 = lr
    proxy_lr: float = 1e-2  # class proxies, where the recipe has them
    # torch's Adam defaults, what a PML loop gets; the JRD authors' code uses 1e-4 and 0.01
    # (configs/jrd-*.yaml), which the JRD paper does not state
    weight_decay: float = 0.0
    adam_eps: float = 1e-8  # Adam's epsilon
    lr_step: int = 0  # multiply the rates by lr_gamma every lr_step epochs; 0 = never
    # or at the start of each of these 0-based epochs (torch's MultiStepLR milestones; the
    # JRD authors' schedule is [19, 39]); set it with lr_step: 0 (both are refused)
    lr_milestones: list[int] = field(default_factory=list)
    lr_gamma: float = 0.1
    lr_decay: float = 1.0  # and by lr_decay after every epoch (0.95 in DTML)


@dataclass
class TrainConfig:
    epochs: int = 10
    seed: int = 0
    device: str = "auto"  # auto = cuda when available, else cpu
    eval_every: int = 1
    tolerance: float = 0.0  # stop when |J_k - J_(k-1)| < tolerance (epoch-mean loss); 0 = never
    steps_per_epoch: int = 0  # stop each epoch after this many steps; 0 = the whole split
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; a gradient scaler for fp16)
    deterministic: bool = False  # bit-repeatable on a GPU (deterministic kernels, no autotune)
    # torch.compile the training step's forward (its backward follows): fewer, fused kernels
    # for a GPU step that the host cannot keep fed. The first steps compile (about a minute).
    compile: bool = False
    # under torchrun: each rank computes only its rows of JRS's global kernel matrices
    sharded_kernels: bool = False
    # treat floats below 1.2e-38 as zero on the CPU: a run whose weights decay towards zero
    # otherwise slows down 3x or more (docs/benchmarks.md); it changes numbers only there
    flush_denormal: bool = False
    # choosing an epoch on the validation part (both need data.validation > 0):
    keep_best: bool = False  # also keep checkpoints/best.pt, the best-scoring epoch
    patience: int = 0  # stop after this many evaluations without a better score; 0 = never
    select_metric: str = "recall@1"  # the score they compare (higher is better)


@dataclass
class DomainConfig:
    """Adds beta * MMD(source, target embeddings) to any recipe (needs a domain pair)."""

    beta: float = 0.0
    kernel: str = "linear"  # linear (Eq. 6 of DTML) | gaussian (multi-kernel, adaptive)


@dataclass
class EvalConfig:
    ks: list[int] = field(default_factory=list)  # Recall@K; [] = the dataset's usual ones
    metric: str = "cosine"
    nmi: bool = True
    embed_batch_size: int = 256  # samples embedded at once


@dataclass
class RunConfig:
    recipe: str
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    domain: DomainConfig = field(default_factory=DomainConfig)
    method: Any = None  # the recipe's hyperparameter dataclass

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain Python values: a NumPy scalar set from Python (a loop over
        ``np.arange``) becomes its Python number, which YAML can write."""
        return dataclasses.asdict(self, dict_factory=lambda items: {
            key: _plain(value) for key, value in items})


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return type(value)(_plain(item) for item in value)
    return value.item() if isinstance(value, np.generic) else value


# train.device and the --device of the commands that read a run: auto, cpu, cuda or cuda:N
DEVICE_PATTERN = r"auto|(cpu|cuda)(:\d+)?"


def device_name_problem(name: str, what: str = "the device") -> str | None:
    """What is wrong with ``name`` as a device (``what`` names where it came from), or None
    where it is auto, cpu, cuda or cuda:N. Whether this machine has that device is checked
    where it is used (:func:`kdml.training.build.resolve_device`)."""
    if re.fullmatch(DEVICE_PATTERN, name):
        return None
    return f"{what} must be auto, cpu, cuda or cuda:N, got {name!r}"


SECTIONS = ("data", "model", "optim", "train", "eval", "domain", "method")
# The first line of the config.yaml kdml writes into a run folder, ``config_format: N``: a file
# with it holds every setting of its run (format 1: every setting of kdml then), so a setting
# it lacks was deleted, and is refused rather than read as a default (the built-in one, not
# the recipe's). A run folder from before the line reads each setting added to kdml since it
# was written as the value its run computed with (ADDED_BEFORE_FORMAT).
FORMAT_KEY = "config_format"
CONFIG_FORMAT = 1
# Settings added to kdml before its config.yaml had a format line, each with the value that
# computes what the runs before it computed, which a config.yaml without the line that lacks
# it reads (where its recipe has it). All but one are their built-in defaults.
ADDED_BEFORE_FORMAT: dict[str, Any] = {
    "data.validation": 0.0, "train.keep_best": False, "train.patience": 0,
    "train.select_metric": "recall@1", "train.flush_denormal": False, "optim.lr_milestones": [],
    # the SimCLR recipes forwarded both views as one batch before (today's default: apart)
    "method.joint_views": True,
    # the SimCLR recipes' heads were as wide as d (0) before it could be set
    "method.proj_hidden": 0}
# A setting added to kdml after format N raises CONFIG_FORMAT to N + 1 and is named here with
# that format and the value that computes what the runs before it computed, which a run
# folder of an earlier format (that lacks it) reads: {"section.key": (N + 1, value)}.
ADDED_IN_FORMAT: dict[str, tuple[int, Any]] = {}
# Top-level keys of a config file that are not settings: the recipe's name, a description of
# the paper table it mirrors, a grid of settings to run one by one, and a run folder's
# config.yaml format (taken, and ignored, in a --config file: a run's config.yaml reused).
FILE_ONLY_KEYS = ("recipe", "paper", "grid", FORMAT_KEY)
# why each is refused as a key=value override (or inside a section, or as a grid key)
FILE_ONLY_KEY_PROBLEMS = {
    "recipe": "recipe is not a setting: name the recipe as the command's first argument "
              "('kdml train RECIPE ...') or in a --config file's recipe: line",
    "paper": "paper is not a setting but a config file's description of the paper table it "
             "mirrors; it has no effect on a run",
    "grid": "grid is not a setting but a config file's grid of settings, e.g. grid: "
            "{method.alpha: [0.5, 1.0]}; an override sets one value",
    FORMAT_KEY: f"{FORMAT_KEY} is not a setting but the format of the config.yaml kdml writes "
                "into a run folder; it has no effect on a run",
}


def resolve_config(
    recipe: str,
    method_params: type,
    recipe_defaults: dict[str, Any] | None = None,
    file_values: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    settings: dict[str, Any] | None = None,
) -> RunConfig:
    """Build a validated config: dataclass defaults < recipe defaults < file < overrides <
    ``settings`` (values as a config file gives them: a grid cell's)."""
    config = RunConfig(recipe=recipe, method=method_params())
    for source in (recipe_defaults or {}, file_values or {}):
        given: dict[str, tuple[str, str]] = {}  # each setting's key, as written
        for top, key, value in _flat_items_under(file_settings(source)):
            if key.split(".")[0] in FILE_ONLY_KEYS:  # grid.alpha: at the top level
                raise KdmlError(f"{key} is not a setting; a config file's {key.split('.')[0]} "
                                f"is one mapping, e.g. grid: {{method.alpha: [0.5, 1.0]}}")
            if key in SECTIONS and value is None:  # `train:` with its keys commented out
                raise KdmlError(f"the config file's {key}: is empty; give it settings, e.g. "
                                f"{key}: {{{_first_leaf(config, key)}: ...}}, or drop the line")
            full_key = resolve_key(config, key)
            # train: {epochs: 2} and train.epochs: 3 are both train.epochs: said apart
            spelled = key if key == top else f"{top}: {{{key.removeprefix(top + '.')}: ...}}"
            if full_key in given:  # YAML's own check sees only one mapping's keys
                first, first_spelled = given[full_key]
                both = (first_spelled, spelled) if first == key else (first, key)
                raise KdmlError(f"the config file sets {full_key} twice, as {both[0]} and as "
                                f"{both[1]}; keep one")
            given[full_key] = (key, spelled)
            set_key(config, key, value)
    for item in overrides or []:
        key, text = override_parts(item)
        set_key(config, key, override_value(config, key, item, text))
    for key, value in (settings or {}).items():
        set_key(config, key, value)
    validate(config)
    return config


def _first_leaf(config: RunConfig, section: str) -> str:
    """The name of ``section``'s first setting (``epochs`` of ``train``), for an example."""
    fields = dataclasses.fields(getattr(config, section))
    return fields[0].name if fields else "KEY"


class _StrictConstruction(yaml.constructor.SafeConstructor):
    """What kdml's YAML loaders construct otherwise than PyYAML's safe loader. A key given
    twice in one mapping is refused: YAML forbids it, but PyYAML keeps the last value, so
    ``epochs: 1`` then ``epochs: 2`` would train 2 epochs without a word about the first.
    So are the numbers that YAML 1.1 (PyYAML's) reads otherwise than they look: ``seed: 010``
    is octal 8 and ``epochs: 1:30`` is base 60 (90); YAML 1.2 and most other readers would
    say 10 and a string."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            _refuse_yaml11_number(node)
            return super().construct_yaml_int(node)  # type: ignore[no-untyped-call,no-any-return]
        except ValueError:  # Python's limit on the digits of an int read from text
            # 0x_: YAML's int, no digits (also with thousands of underscores, not digits)
            if len(node.value.replace("_", "")) <= sys.get_int_max_str_digits():
                raise _UnreadableNumber(
                    None, None, f"{node.value!r} is read by YAML 1.1 as a number without "
                    f"digits: write a number{QUOTE_AS_TEXT}", node.start_mark) from None
            raise _UnreadableNumber(
                None, None, f"a number of {len(node.value):,} characters, more digits than "
                f"Python reads ({sys.get_int_max_str_digits():,})", node.start_mark) from None

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        _refuse_yaml11_number(node)
        return super().construct_yaml_float(node)  # type: ignore[no-untyped-call,no-any-return]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *anchor": keys it may override
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            try:
                given = seen.get(key)
            except TypeError:  # an unhashable key: the mapping's own construction says so
                break
            if given is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (lines {given} and {line}): "
                    "keep one")  # no mark: the lines are said
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


class _UniqueKeyLoader(_StrictConstruction, yaml.SafeLoader):
    """PyYAML's safe loader, in Python, with :class:`_StrictConstruction`: its messages are
    the ones kdml shows for a file it cannot read."""


# libyaml's parser (PyYAML's C one, where PyYAML was built with it) reads a run folder's
# config.yaml about 8 times faster: a report reads hundreds of them. Only its parsing is C;
# what it builds (_StrictConstruction, the resolver) is the same Python as _UniqueKeyLoader's.
_C_PARSED = getattr(yaml, "__with_libyaml__", False)
_C_PARSED_BASE: Any = yaml.CSafeLoader if _C_PARSED else yaml.SafeLoader


class _CParsedLoader(_StrictConstruction, _C_PARSED_BASE):
    """:class:`_UniqueKeyLoader` with libyaml's parser (PyYAML's own without libyaml)."""


# PyYAML calls the function registered for a tag, not the method of the loader's class: both
# loaders find these in _StrictConstruction's table (typed for a loader class's methods).
_StrictConstruction.add_constructor(  # type: ignore[type-var]
    "tag:yaml.org,2002:int", _StrictConstruction.construct_yaml_int)
_StrictConstruction.add_constructor(  # type: ignore[type-var]
    "tag:yaml.org,2002:float", _StrictConstruction.construct_yaml_float)


# Characters around which libyaml reads some text otherwise than PyYAML (see _load_yaml);
# none of them is in a config.yaml kdml writes, whose reading keeps libyaml's speed
_PARSED_OTHERWISE_BY_LIBYAML = frozenset("\t\r?!%|")


def _load_yaml(text: str) -> Any:
    """``text`` read as YAML by :class:`_UniqueKeyLoader`, parsed by libyaml where PyYAML has
    it. Text libyaml does not read is read again in Python, whose error is raised: libyaml's
    words for a problem differ from PyYAML's, and its line can be another; and it raises
    UnicodeEncodeError, not YAML's error, for a lone surrogate (an argument's byte that is
    not UTF-8). Text that is not ASCII or holds one of :data:`_PARSED_OTHERWISE_BY_LIBYAML`
    is read in Python alone: there libyaml read some text PyYAML refuses (``epochs:<TAB>2``,
    ``ks: [1? 2]``, ``%YAML 1.1#``) or built another value (``root: !``) in a differential
    fuzz of 20,000 edits of kdml's config files; with those read in Python, none of 40,000
    differed."""
    if _C_PARSED and text.isascii() and not _PARSED_OTHERWISE_BY_LIBYAML.intersection(text):
        try:
            return yaml.load(text, Loader=_CParsedLoader)  # noqa: S506 (a safe loader)
        except (yaml.YAMLError, UnicodeEncodeError):
            pass
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)


# The end of an ambiguous number's advice in a config file, where a text setting may hold it.
QUOTE_AS_TEXT = ", or quote it as text"


def _refuse_yaml11_number(node: yaml.ScalarNode) -> None:
    text = node.value.replace("_", "")
    digits = text.lstrip("+-")
    # one digit after the zeros (07) is that number read either way: only 010 and longer differ
    octal = digits.isdigit() and digits[0] == "0" and len(digits.lstrip("0")) > 1
    if not octal and ":" not in text:
        return
    numbers = yaml.constructor.SafeConstructor()  # PyYAML's own reading, to say what it is
    if octal:
        value: Any = numbers.construct_yaml_int(node)  # type: ignore[no-untyped-call]
        sign = "-" if text.startswith("-") else ""
        problem = f"octal ({value}): write {sign}{digits.lstrip('0')} or {value}{QUOTE_AS_TEXT}"
    else:
        read = numbers.construct_yaml_float if "." in text else numbers.construct_yaml_int
        value = read(node)  # type: ignore[no-untyped-call]
        problem = f"base 60 ({value}): write {value}{QUOTE_AS_TEXT}"
    raise _AmbiguousNumber(
        None, None, f"{node.value!r} is read by YAML 1.1 as {problem}", node.start_mark)


class _AmbiguousNumber(yaml.constructor.ConstructorError):
    """Valid YAML 1.1, but not the number most readers would take it for."""


class _UnreadableNumber(_AmbiguousNumber):
    """A number Python will not read (more digits than its limit): refused, with its line, as
    an ambiguous one is."""


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a nested dict (a key given twice is refused)."""
    path = Path(path)
    if not path.is_file():
        # a run folder, where --resume and the commands that read a run take the folder
        in_run = path / "config.yaml"
        hint = f"; a run folder's settings are its {in_run}" if in_run.is_file() else ""
        raise KdmlError(f"config file {path} {why_missing(path, 'file')}{hint}")
    try:
        values = _load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise KdmlError(f"config file {path} is not UTF-8 text; save it as a YAML file") from None
    except _AmbiguousNumber as error:
        line = error.problem_mark.line + 1 if error.problem_mark else "?"
        raise KdmlError(f"config file {path}: {error.problem} (line {line})") from None
    except yaml.YAMLError as error:
        # the problem and its line ("found character '\t' that cannot start any token"),
        # not the context PyYAML's message starts with ("while scanning for the next token")
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise KdmlError(f"config file {path} is not valid YAML: {problem}{where}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise KdmlError(f"config file {path} must hold a mapping of keys to values")
    return values


def override_parts(item: str) -> tuple[str, str]:
    """``"train.epochs=3"`` -> ``("train.epochs", "3")``: an override's key and its value's
    text."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(c.isspace() for c in key):
        raise KdmlError(f"malformed override {item!r}: write key=value, e.g. train.epochs=5")
    return key, text


def override_value(config: RunConfig, key: str, item: str, text: str) -> Any:
    """The value of the override ``item`` (``key=text``) of ``config``: a text setting takes
    its text as written, less one pair of enclosing quotes (YAML would read ``data.root=2024``
    as a number, ``data.root=no`` as False, and cut ``photos #2`` at its comment); any other
    is read as YAML."""
    full_key = resolve_key(config, key)
    section, leaf = full_key.split(".", 1)
    if _field_types(type(getattr(config, section)))[leaf] is not str:
        return _yaml_value(item, text)
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text


def _yaml_value(item: str, text: str) -> Any:
    try:
        return _load_yaml(text) if text.strip() else ""
    except _AmbiguousNumber as error:
        # an override read as YAML sets no text (a text setting's takes its text as written:
        # override_value), so quoting it would only be refused as the wrong type
        problem = (error.problem or "").removesuffix(QUOTE_AS_TEXT)
        raise KdmlError(f"override {item!r}: {problem}") from None
    except yaml.YAMLError:
        # `eval.ks=[1, 2]` unquoted reaches kdml as `eval.ks=[1,` and `2]`
        hint = ("; the shell splits an unquoted value at its spaces: quote the whole override, "
                "e.g. 'eval.ks=[1, 2]'" if text.rstrip().endswith(",") else "")
        raise KdmlError(f"malformed value in override {item!r}{hint}") from None


def _flat_items(values: dict[str, Any], prefix: str = "",
                _within: tuple[dict[str, Any], ...] = ()) -> Iterator[tuple[str, Any]]:
    """:func:`flatten`'s pairs, each as the file gives it: ``train: {epochs: 2}`` beside
    ``train.epochs: 3`` is two pairs of one key (the dict would keep the last)."""
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if any(value is outer for outer in (*_within, values)):  # `a: &x {b: *x}`
                raise KdmlError(f"{name} holds the mapping it is in (a YAML alias, *name, "
                                "inside its own anchor, &name): write its values out")
            yield from _flat_items(value, name + ".", (*_within, values))
        else:
            yield name, value


def file_settings(values: dict[str, Any]) -> dict[str, Any]:
    """A config file's ``values`` without its :data:`FILE_ONLY_KEYS` (recipe, paper, grid, the
    format line): its settings, nested as written."""
    return {name: value for name, value in values.items() if name not in FILE_ONLY_KEYS}


def _flat_items_under(values: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """:func:`_flat_items` of ``values``, each with the top-level key it is under."""
    for top, value in values.items():
        for key, item in _flat_items({top: value}):
            yield top, key, item


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"epochs": 2}}`` -> ``{"train.epochs": 2}``."""
    return dict(_flat_items(values, prefix))


def all_keys(config: RunConfig) -> list[str]:
    return list(_keys_of_sections(tuple(type(getattr(config, section)) for section in SECTIONS)))


# Cached: a report reads hundreds of run folders' configs, each resolving every key it holds
# (the fields of the same seven dataclasses listed again for each key had been a tenth of it).
@functools.cache
def _keys_of_sections(section_types: tuple[type, ...]) -> tuple[str, ...]:
    return tuple(f"{section}.{f.name}" for section, cls in zip(SECTIONS, section_types, strict=True)
                 for f in dataclasses.fields(cls))


def resolve_key(config: RunConfig, key: str) -> str:
    """A full dotted key, a unique leaf name, or an error that suggests the nearest key."""
    keys = all_keys(config)
    if key in keys:
        return key
    by_leaf = [k for k in keys if k.split(".", 1)[1] == key]
    if len(by_leaf) == 1:
        return by_leaf[0]
    if len(by_leaf) > 1:
        raise KdmlError(f"config key {key!r} is ambiguous; write one of: {', '.join(by_leaf)}")
    if key in SECTIONS:
        example = next((k for k in keys if k.startswith(f"{key}.")), f"{key}.KEY")
        raise KdmlError(f"{key!r} is a section, not a setting; set one of its keys, e.g. "
                        f"{example}=VALUE ('kdml config {config.recipe}' lists them)")
    if key in FILE_ONLY_KEYS:  # "did you mean 'resize'?" for recipe=mrd had said nothing of why
        raise KdmlError(FILE_ONLY_KEY_PROBLEMS[key])
    leaves = [k.split(".", 1)[1] for k in keys]
    guesses = _in_other_case(keys, key) or _moved(keys, key)
    owners = [] if guesses else _recipes_with_method_setting(key, config.recipe)
    if owners:  # a config of another recipe: "did you mean 'method.margin'?" misled
        raise KdmlError(f"unknown config key {key!r} for recipe {config.recipe!r}: it is a "
                        f"method setting of {', '.join(owners)} ('kdml config "
                        f"{config.recipe}' lists {config.recipe}'s keys)")
    guesses = guesses or difflib.get_close_matches(key, keys + leaves, n=1, cutoff=0.6)
    hint = (f"; did you mean {' or '.join(map(repr, guesses))}?" if guesses
            else f"; 'kdml config {config.recipe}' lists every key")
    raise KdmlError(f"unknown config key {key!r} for recipe {config.recipe!r}{hint}")


def _recipes_with_method_setting(key: str, recipe: str) -> list[str]:
    """The recipes other than ``recipe`` whose ``method`` section has ``key`` (``method.dim``,
    or the bare ``dim``), in ``kdml recipes``' order."""
    from kdml.training.recipes import RECIPES  # here: the recipes import this module

    leaf = key.removeprefix("method.")
    return [name for name, other in RECIPES.items() if name != recipe
            and leaf in (field.name for field in dataclasses.fields(other.params))]


def _in_other_case(keys: list[str], key: str) -> list[str]:
    """The setting ``key`` names in other case (difflib's ratio is case-sensitive, so it
    found none for TRAIN.EPOCHS): the full key (``DOMAIN.beta``: ``domain.beta``, where the
    leaf alone had also named dtml's ``method.beta``), the leaf as written where it is unique
    (``EPOCHS``: ``epochs``), or each setting of an ambiguous leaf (``BETA``: ``domain.beta``
    and ``method.beta``, not ``beta``, which is refused as ambiguous); of a section
    (``DOMAIN``), its first setting. [] where no key differs from ``key`` in case alone."""
    folded = key.casefold()
    same = [k for k in keys if k.casefold() == folded]
    if same:
        return same
    same_leaf = [k for k in keys if k.split(".", 1)[1].casefold() == folded]
    if len(same_leaf) == 1:
        return [same_leaf[0].split(".", 1)[1]]
    return same_leaf or [k for k in keys if k.split(".", 1)[0].casefold() == folded][:1]


def _moved(keys: list[str], key: str) -> list[str]:
    """A setting under the wrong section (``train.lr``, also in other case: ``train.LR``)
    means that setting (``optim.lr``), before any spelling that merely looks alike
    (``train.tolerance``; ``train.LR`` had been guessed ``train.seed``)."""
    if "." not in key:
        return []
    leaf = key.split(".", 1)[1].casefold()
    return [k for k in keys if k.split(".", 1)[1].casefold() == leaf]


def set_key(config: RunConfig, key: str, value: Any) -> None:
    """Set ``key`` to ``value``, checked against its field's type."""
    full_key = resolve_key(config, key)
    section_name, leaf = full_key.split(".", 1)
    section = getattr(config, section_name)
    field_type = _field_types(type(section))[leaf]
    try:
        checked = coerce(value, field_type, full_key)
    except KdmlError as error:
        raise KdmlError(f"{error}{what_to_write(value, field_type)}") from None
    check_finite(checked, full_key)
    setattr(section, leaf, checked)


def what_to_write(value: Any, annotation: Any) -> str:
    """The end of the refusal of a config file's or an override's ``value`` of the wrong type
    for a setting (``annotation``): what to write instead, where a YAML reading explains it
    (``root: 2024`` is a number, ``nmi: 1`` no boolean, ``epochs: '10'`` text); "" otherwise.
    A text setting's override takes its text as written, so only a file's value is quoted."""
    if annotation is str and (value is None or isinstance(value, int | float | date)):
        if value is None:
            return ": YAML reads an empty value (or null, ~) as none; write '' for no text"
        if isinstance(value, bool):
            return (": YAML reads yes, no, on, off, true and false as booleans; put the text "
                    "in quotes, e.g. 'no'")
        kind = "a date" if isinstance(value, date) else "a number"
        return f": YAML reads {value} as {kind}; put it in quotes, e.g. '{value}', for text"
    if annotation is bool and not isinstance(value, bool):
        return ": write true or false"
    if annotation is int and not isinstance(value, bool):
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return _write_unquoted(value)
        if isinstance(value, str) and (whole := _whole_number(value)) is not None:  # 1e3
            return f": write {whole}"  # (text to YAML 1.1)
        if isinstance(value, float) and value.is_integer():
            return f": write {int(value)}, a whole number"
        if isinstance(value, float):
            return ": write a whole number"
    if annotation is float and isinstance(value, bool):
        return ": write a number, e.g. 0.5"
    if annotation is float and isinstance(value, str) and _YAML12_FLOAT.fullmatch(value.strip()):
        if re.fullmatch(r"\s*[+-]?\d+\s*", value):  # '010': 10, as an int setting says
            return _write_unquoted(value)
        return f": write {value.strip()}, without quotes"
    return ""


def _write_unquoted(text: str) -> str:
    """The hint for a quoted whole number ``text`` (``'010'``: write 10, without quotes); ""
    for one of more digits than Python reads, which no setting takes unquoted either (int()
    had raised its ValueError as a traceback)."""
    try:
        return f": write {int(text)}, without quotes"
    except ValueError:
        return ""


# YAML 1.2's float: a number to most readers, text to YAML 1.1 (PyYAML) without a dot and a
# signed exponent (1e-3, 1.5e3)
_YAML12_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
# what Python reads as NaN or infinity, text to YAML 1.1 (whose own are .nan and .inf)
_NOT_FINITE = re.compile(r"[-+]?(nan|inf|infinity)", re.IGNORECASE)


def _text_to_yaml11(text: str) -> bool:
    """Whether ``text`` is a float that YAML 1.1 reads as text even unquoted (``1e-3``; and
    ``nan``, which check_finite then refuses by name): a float setting takes it as its number,
    however it was written."""
    if not (_YAML12_FLOAT.fullmatch(text) or _NOT_FINITE.fullmatch(text)):
        return False
    try:
        return isinstance(_load_yaml(text), str)
    except _AmbiguousNumber:  # '010' (octal to YAML 1.1), 5,000 digits: refused unquoted, so
        return False  # no text YAML 1.1 reads as a float: text here, as '10' is (a traceback)


def _whole_number(text: str) -> int | None:
    """The whole number ``text`` writes as a float (``1e3``: 1000), else None."""
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


def check_finite(value: Any, key: str) -> None:
    """Refuse NaN and infinity for any float setting: range checks such as ``lr > 0`` let
    infinity through and every comparison with NaN is false, so either would reach training
    and fail there with a misleading message, or train on a silently wrong number."""
    values = value if isinstance(value, list) else [value]
    if any(isinstance(item, float) and not math.isfinite(item) for item in values):
        raise KdmlError(f"{key} must be a finite number, got {value!r}")


def check_fields(settings: Any, section: str = "method") -> None:
    """Check every field of a settings dataclass (a recipe's params) as :func:`set_key` checks
    a config's value: against its annotation, so that an int field refuses ``2.5`` and
    ``"2"`` (a count of 2.5 failed later inside torch, a string in the range checks' ``<``
    with a raw TypeError), a NumPy number is taken as its Python number, and a float field
    refuses NaN and infinity, which the params' own range checks let through. A library user
    builds the params without a config, so nothing else has checked them."""
    for name, annotation in _field_types(type(settings)).items():
        key = f"{section}.{name}"
        value = coerce(_plain(getattr(settings, name)), annotation, key)
        check_finite(value, key)
        setattr(settings, name, value)


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check ``value`` against a field's annotation; ints are accepted for floats."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, key)
            except KdmlError:
                continue
        raise KdmlError(f"{key}={value!r} has the wrong type; expected {annotation}")
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        items = value if isinstance(value, list | tuple) else [value]
        try:
            return [coerce(item, item_type, key) for item in items]
        except KdmlError:  # name the list, not its item type: eval.ks= is not "expected int"
            name = getattr(item_type, "__name__", str(item_type))
            example = "[1,2]" if item_type is int else "[a,b]"
            raise KdmlError(f"{key}={value!r} has the wrong type; expected a list of {name}, "
                            f"e.g. {key}={example}") from None
    if annotation is float and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int past float's range: infinite, refused as 1e999 is
            return math.inf if value > 0 else -math.inf
    if annotation is float and isinstance(value, str) and _text_to_yaml11(value):
        # YAML 1.1 reads 1e-3 (no dot) as text, however written; a number it reads (0.1, 10)
        # arrives as text only quoted, which an int setting refuses too ("write 10, without
        # quotes"), as it does text that Python alone reads (' 0.1', '1_0', 'nan')
        return float(value)
    if annotation is Any or (isinstance(annotation, type) and isinstance(value, annotation)
                              and not (annotation is int and isinstance(value, bool))):
        return value
    expected = getattr(annotation, "__name__", str(annotation))
    raise KdmlError(f"{key}={value!r} has the wrong type; expected {expected}")


# Far beyond any useful rate; torch's Adam turns rate / (1 - beta1 ** step) into a float32
# tensor, which overflowed (a traceback) for rates above about 3.4e37.
MAX_LR = 1e30


# Far beyond any use, below what fails inside torch or Python with a traceback (a layer of 1e9
# outputs cannot be allocated; a batch of 1e20 overflows the loaders' slicing).
MAX_EMBEDDING_SIZE = 2**16
MAX_BATCH = 2**31
# Far beyond any use (DML decodes images at 256 to 1024 pixels; no machine gains from hundreds
# of loader processes): larger values were typos that failed with a traceback, an image batch
# of terabytes or a fork per worker until the system refused.
MAX_IMAGE_SIDE = 2**13
MAX_WORKERS = 256


def validate(config: RunConfig) -> None:
    """Range checks that need no data; the rest is checked where the data is known."""
    device_problem = device_name_problem(config.train.device, "train.device")
    for key, value in (("data.dataset", config.data.dataset), ("data.root", config.data.root),
                       ("model.weights", config.model.weights)):
        check_no_nul_byte(value, f"{key}={value!r}")
    checks = [
        (config.data.dataset.strip() != "",
         "the dataset name is empty; name a dataset, e.g. --dataset mnist5k ('kdml datasets' "
         "lists them)"),
        (config.data.batch_size >= 2 or config.data.batch_size == 0,
         "data.batch_size must be at least 2 (or 0 for full batches)"),
        (config.data.split in ("standard", "class-disjoint", "seen-holdout"),
         "data.split must be standard, class-disjoint or seen-holdout"),
        (-1 <= config.data.num_workers <= MAX_WORKERS,
         f"data.num_workers must be from 0 to {MAX_WORKERS} (or -1 = automatic)"),
        (8 <= config.data.resize <= MAX_IMAGE_SIDE,
         f"data.resize must be from 8 to {MAX_IMAGE_SIDE:,} pixels"),
        (1 <= config.data.image_size <= config.data.resize,
         f"data.image_size must be from 1 to data.resize (the short side images are resized to "
         f"before the crop), here {config.data.resize}; it is {config.data.image_size}"),
        (config.data.on_bad_image in ("error", "skip"), "data.on_bad_image must be error or skip"),
        (1 <= config.eval.embed_batch_size <= MAX_BATCH,
         f"eval.embed_batch_size must be from 1 to {MAX_BATCH:,}"),
        (0 < config.data.holdout_fraction < 1, "data.holdout_fraction must be in (0, 1)"),
        (0 <= config.data.validation < 1,
         "data.validation must be in [0, 1) (0 = test; e.g. 0.2 validates on a fifth of the "
         "training part)"),
        (config.data.pca_dim >= 0, "data.pca_dim must be >= 0 (0 = no PCA)"),
        (config.optim.name in ("adam", "sgd", "rmsprop"),
         "optim.name must be adam, sgd or rmsprop"),
        (config.optim.adam_eps > 0, "optim.adam_eps must be positive"),
        (config.optim.weight_decay >= 0, "optim.weight_decay must be >= 0 (0 = none)"),
        # torch's optimisers take both as float32 numbers: beyond its range weight decay was a
        # traceback ("value cannot be converted to type float without overflow") and Adam's
        # epsilon infinity, every update 0, a run that trained nothing without a word
        (max(config.optim.adam_eps, config.optim.weight_decay) <= MAX_LR,
         f"optim.adam_eps and optim.weight_decay must be at most {MAX_LR:g} (the optimiser "
         "computes in float32, which overflows at 3.4e+38)"),
        (config.train.steps_per_epoch >= 0,
         "train.steps_per_epoch must be >= 0 (0 = the whole training split)"),
        (0 < config.optim.lr_decay <= 1, "optim.lr_decay must be in (0, 1]"),
        # a decay factor: 0 stops learning at the first decay, > 1 would grow the rates
        (0 < config.optim.lr_gamma <= 1,
         "optim.lr_gamma must be in (0, 1] (e.g. 0.1 divides the rates by 10 at each step)"),
        (config.train.tolerance >= 0, "train.tolerance must be >= 0"),
        (config.train.patience >= 0, "train.patience must be >= 0 (0 = never stop early)"),
        (config.data.validation > 0 or not (config.train.keep_best or config.train.patience),
         "train.keep_best and train.patience choose an epoch by its scores, so they need "
         "data.validation > 0: chosen on the test part, the number would be tuned on it"),
        (config.domain.beta >= 0, "domain.beta must be >= 0"),
        (config.domain.kernel in ("linear", "gaussian"),
         "domain.kernel must be linear or gaussian"),
        (config.data.samples_per_class >= 0, "data.samples_per_class must be >= 0"),
        (config.train.epochs >= 1, "train.epochs must be at least 1"),
        (0 <= config.train.seed < 2**63, "train.seed must be from 0 to 2**63 - 1"),
        (config.train.eval_every >= 1, "train.eval_every must be at least 1"),
        (config.optim.lr > 0 and config.optim.proxy_lr > 0 and config.optim.head_lr >= 0,
         "learning rates must be positive (optim.head_lr = 0 means optim.lr)"),
        (max(config.optim.lr, config.optim.proxy_lr, config.optim.head_lr) <= MAX_LR,
         f"optim.lr, optim.proxy_lr and optim.head_lr must be at most {MAX_LR:g} (Adam's "
         "first step is 10x the rate, and float32 overflows at 3.4e+38)"),
        (config.train.precision in ("fp32", "bf16", "fp16"),
         "train.precision must be fp32, bf16 or fp16"),
        (config.model.pooling in ("avg", "max", "avg+max"),
         "model.pooling must be avg, max or avg+max"),
        (config.optim.lr_step >= 0, "optim.lr_step must be >= 0 (0 = no decay)"),
        (all(isinstance(m, int) and m >= 1 for m in config.optim.lr_milestones)
         and list(config.optim.lr_milestones) == sorted(set(config.optim.lr_milestones)),
         "optim.lr_milestones must be increasing epoch numbers >= 1, e.g. [19, 39]"),
        (not (config.optim.lr_step and config.optim.lr_milestones),
         "set optim.lr_step or optim.lr_milestones, not both"),
        (1 <= config.model.embedding_size <= MAX_EMBEDDING_SIZE,
         f"model.embedding_size must be from 1 to {MAX_EMBEDDING_SIZE:,}"),
        (all(k >= 1 for k in config.eval.ks), "eval.ks must be positive ints"),
        (config.eval.metric in ("cosine", "euclidean"), "eval.metric must be cosine or euclidean"),
        (device_problem is None, device_problem or ""),
    ]
    for ok, message in checks:
        if not ok:
            raise KdmlError(message)
    check = getattr(config.method, "validate", None)
    if check is not None:
        check()


def with_absolute_paths(config: RunConfig) -> RunConfig:
    """``config`` with its paths (a path-named dataset, ``data.root``, ``model.weights``)
    absolute against the current folder, as a new run stores them: ``kdml eval``, ``--resume``
    and the other commands read a run's config from any folder, where a relative path would
    name other files (or none)."""
    from kdml.data.registry import with_absolute_path

    def absolute(path: str) -> str:
        return str(home_expanded(path).absolute()) if path.strip() else path

    data = dataclasses.replace(config.data, dataset=with_absolute_path(config.data.dataset),
                               root=absolute(config.data.root))
    model = dataclasses.replace(config.model, weights=absolute(config.model.weights))
    return dataclasses.replace(config, data=data, model=model)


def _field_types(cls: type) -> Mapping[str, Any]:
    # cached: get_type_hints evaluates every string annotation again on each call (a quarter
    # of the time of reading a run folder's config.yaml had gone to it)
    if cls not in _FIELD_TYPES:
        hints = typing.get_type_hints(cls)
        _FIELD_TYPES[cls] = types.MappingProxyType(
            {f.name: hints[f.name] for f in dataclasses.fields(cls)})
    return _FIELD_TYPES[cls]


_FIELD_TYPES: dict[type, Mapping[str, Any]] = {}


def save_config(config: RunConfig, path: Path) -> None:
    """Write ``config`` as a run folder's YAML, every setting after its format's line
    (:data:`FORMAT_KEY`), through a new file: a write cut short (a full disk) leaves no
    truncated config.yaml, which --resume would complete with defaults."""
    text = yaml.safe_dump({FORMAT_KEY: CONFIG_FORMAT, **config.to_dict()}, sort_keys=False)
    write_through_new_file(path, lambda new: new.write_text(text))


def config_format(values: dict[str, Any], source: str) -> int:
    """The format of a run folder's config.yaml (``values``, read from ``source``): its
    :data:`FORMAT_KEY` line's, or 0 for a file written before kdml wrote that line."""
    if FORMAT_KEY not in values:
        return 0
    version = values[FORMAT_KEY]
    if (isinstance(version, int) and not isinstance(version, bool)
            and version > CONFIG_FORMAT):
        raise KdmlError(f"{source} was written by a newer kdml ({FORMAT_KEY}: {version}; this "
                        f"one reads up to {CONFIG_FORMAT}): upgrade kdml to read the run")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise KdmlError(f"{source}: {FORMAT_KEY} is {version!r}, but kdml writes "
                        f"{FORMAT_KEY}: {CONFIG_FORMAT}; put that line back as it was")
    return version


def written_keys(config: RunConfig, values: dict[str, Any]) -> set[str]:
    """The settings a config file's ``values`` give, each as its full key (``epochs`` at the
    top level, ``train: {epochs: 2}`` and ``train.epochs: 2`` are all ``train.epochs``)."""
    return {resolve_key(config, key) for key, _ in _flat_items(file_settings(values))}


def missing_settings(config: RunConfig, values: dict[str, Any],
                     version: int) -> tuple[list[str], dict[str, Any]]:
    """The settings of ``config`` that a run folder's config.yaml of format ``version``
    (``values``; 0: one written before the format line) lacks, in two kinds: those kdml wrote
    there, so deleted (none for format 0), and those added to kdml after ``version``
    (:data:`ADDED_IN_FORMAT`; for format 0 also :data:`ADDED_BEFORE_FORMAT`), each with the
    value its run computed with."""
    added = {key: value for key, (format_added, value) in ADDED_IN_FORMAT.items()
             if format_added > version}
    if version == 0:
        added = {**ADDED_BEFORE_FORMAT, **added}
    given = written_keys(config, values)
    lacking = [key for key in all_keys(config) if key not in given]
    deleted = [] if version == 0 else [key for key in lacking if key not in added]
    return deleted, {key: added[key] for key in lacking if key in added}
