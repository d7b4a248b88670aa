"""Which settings of a run's ``config.yaml`` may change before ``kdml train --resume``.

A resumed run continues the run its checkpoint holds: the optimizer's state brings back the
learning rate it trained with, the model its sizes, the sampler its batches. An edit of another
setting would be taken in part (a new ``method.alpha`` applies, a new ``optim.lr`` does not)
and the run's metrics would mix two configurations without a word, so it is refused. These may
change, since they change where or how fast the same run trains, or how long:

- ``train.epochs``: train on, or stop sooner (the README's way to extend a finished run);
- ``train.device``: the same run on another device (a GPU no longer lent, say);
- ``data.num_workers``, ``eval.embed_batch_size``: loader processes, embedding batch size;
- ``data.on_bad_image``: skip an image found unreadable since (its error message says so);
- ``train.flush_denormal``: a run slowed down by subnormal floats goes on without them (its
  numbers change only where values below 1.2e-38 occur, as a change of device changes their
  last bits);
- ``train.compile``, ``train.eval_every``: how the steps run and which epochs are scored,
  not the model (``kdml reproduce`` leaves both out of its run folders' names, and resumes
  its runs with today's values);
- the paths, ``data.root``, a path-named ``data.dataset`` (``folder:``, ``csv:``, ``npz:``)
  and ``model.weights``: the data moved (``data.json`` still checks it is the run's), and the
  checkpoint holds the weights. For the SimCLR recipes only from one file to another: given
  or not, ``model.weights`` decides their inputs' normalisation.
- ``train.sharded_kernels``, ``model.sync_bn``: how several processes compute what one
  computes alone (a run resumed in one process, or on a CPU, drops them).

A setting added to kdml since a checkpoint was written is missing from its config; where kdml
knows the value such runs computed with (``kdml.config.ADDED_BEFORE_FORMAT``,
``ADDED_IN_FORMAT``), a change from it is refused as any edit is.
"""

from __future__ import annotations

from typing import Any

from kdml.config import ADDED_BEFORE_FORMAT, ADDED_IN_FORMAT, RunConfig
from kdml.data.registry import PATH_FORMATS
from kdml.errors import KdmlError

RESUMABLE = frozenset({"train.epochs", "train.device", "data.num_workers",
                       "eval.embed_batch_size", "data.on_bad_image", "train.compile",
                       "train.eval_every", "train.flush_denormal", "data.root",
                       "model.weights",
                       # how several processes compute what one computes alone, so a run
                       # resumed in one process (or on a CPU) drops them, as its refusal says
                       "train.sharded_kernels", "model.sync_bn"})
# The value a checkpoint trained before kdml had a setting computed with, for each setting
# added since kdml wrote checkpoints: its config lacks the key, but not the value.
TRAINED_BEFORE_ADDED: dict[str, Any] = {
    **ADDED_BEFORE_FORMAT, **{key: value for key, (_, value) in ADDED_IN_FORMAT.items()}}


def changed_settings(trained: dict[str, Any], config: RunConfig) -> list[str]:
    """The settings of ``config`` (the run's ``config.yaml`` now) that differ from those the
    checkpoint was trained with (``trained``, its ``config``), as ``"optim.lr 0.001 -> 0.1"``,
    leaving out :data:`RESUMABLE` and settings one of the two does not have (added to kdml
    since, or removed), but for a setting added since whose value the checkpoint's run
    computed with is known (:data:`TRAINED_BEFORE_ADDED`): ``joint_views: false`` added to an
    old run's config.yaml had resumed it with the other computation without a word."""
    now = config.to_dict()
    changes = []
    if trained.get("recipe", config.recipe) != config.recipe:
        changes.append(f"recipe {trained['recipe']!r} -> {config.recipe!r}")
    for section, values in trained.items():
        if not isinstance(values, dict) or not isinstance(now.get(section), dict):
            continue
        values = {**_known_before(section, values, now[section]), **values}
        for key, before in values.items():
            name = f"{section}.{key}"
            if name in RESUMABLE or key not in now[section]:
                continue
            after = now[section][key]
            if name == "data.dataset" and _path_named(before) and _path_named(after):
                # relative then, absolute now: only the kind counts (the data check sees the
                # files); a change of kind is said with the paths the user wrote
                if _prefix(before) != _prefix(after):
                    changes.append(f"{name} {before!r} -> {after!r}")
                continue
            if _plain(before) != _plain(after):
                changes.append(f"{name} {before!r} -> {after!r}")
    model = trained.get("model")
    weights = model.get("weights") if isinstance(model, dict) else None
    if (weights is not None and bool(weights) != bool(config.model.weights)
            and _inputs_follow_weights(config.recipe)):
        changes.append(f"model.weights {weights!r} -> {config.model.weights!r} (with weights "
                       f"{config.recipe} feeds its backbone the backbone's own normalisation, "
                       "without them the [0, 1] images)")
    return changes


def _known_before(section: str, trained: dict[str, Any],
                  now: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``section`` that a checkpoint's ``trained`` values lack, as the
    settings ``now`` has them, each with the value it trained with where kdml knows it
    (:data:`TRAINED_BEFORE_ADDED`: the checkpoint is older than the setting)."""
    return {key: TRAINED_BEFORE_ADDED[f"{section}.{key}"] for key in now
            if key not in trained and f"{section}.{key}" in TRAINED_BEFORE_ADDED}


def _inputs_follow_weights(recipe: str) -> bool:
    """Whether ``recipe``'s input normalisation depends on ``model.weights`` being given
    (:attr:`~kdml.training.recipes.base.Recipe.inputs_follow_weights`); imported here, as the
    recipes import the trainer's modules."""
    from kdml.training.recipes import get_recipe

    try:
        return get_recipe(recipe).inputs_follow_weights
    except KdmlError:  # a recipe kdml no longer has: the recipe check says so
        return False


def first_of(changed: list[str]) -> str:
    """The first of the ``changed`` settings, and how many more (``"optim.lr 0.001 -> 0.1 (and
    1 more)"``), for a one-line refusal."""
    more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
    return f"{changed[0]}{more}"


def _path_named(dataset: Any) -> bool:
    """Whether ``dataset`` names its files by path (``folder:DIR``, ...)."""
    return isinstance(dataset, str) and dataset.startswith(tuple(PATH_FORMATS))


def _prefix(dataset: str) -> str:
    """``"folder:"`` of ``"folder:/data/photos"``: the kind, without the path."""
    return dataset.split(":", 1)[0] + ":"


def _plain(value: Any) -> Any:
    """Lists for tuples (YAML reads a tuple back as a list)."""
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
