"""The checkpoint a resumed run (``kdml train --resume``) continues from, and the refusal of
settings edited since it (which :mod:`~kdml.training.resume_settings` names)."""

from __future__ import annotations

from typing import Any

import torch

from kdml.config import RunConfig
from kdml.data.splits import DataSplits
from kdml.errors import KdmlError
from kdml.training.checkpoint import load_checkpoint
from kdml.training.resume_settings import RESUMABLE, changed_settings, first_of
from kdml.training.run_folder import RunFolder

# The config sections whose settings cannot size the model or name another run's checkpoint:
# an edit confined to them is refused before the data is read (resumed_state).
UNSIZING_SECTIONS = ("optim", "train", "eval")
# The settings that choose which samples make the run's parts: an edit of one is an edit
# whatever the checkpoint, refused before the data is read (the data's check had refused it
# as other data, "or delete data.json to use this data anyway", which then led to another
# refusal)
PART_SETTINGS = ("data.dataset", "data.split", "data.train_classes", "data.holdout_fraction",
                 "data.validation")


def resumed_state(run: RunFolder, config: RunConfig) -> dict[str, Any] | None:
    """The checkpoint ``run`` resumes from (:func:`_checkpoint_to_resume`), its settings
    checked against ``config`` before any data is read where that can be decided then.

    Where the recipe or a setting of the data, model, method or domain differs, the
    checkpoint may be another run's, of another recipe or model shape: nothing is refused here,
    so that :meth:`~kdml.training.trainer.Session.restore` names it as such, and where it
    loads, the trainer's check after it names the edit. Otherwise the edits, in
    :data:`UNSIZING_SECTIONS` only (optim.lr, say), are refused here, as is another
    ``data.dataset`` (not a moved path) or split (:data:`PART_SETTINGS`) whatever else
    differs. ``eval.ks`` left empty is filled
    from the data by :meth:`~kdml.training.trainer.Session.build`, so it is compared after
    it."""
    state = _checkpoint_to_resume(run)
    trained = (state or {}).get("config") or {}
    # another dataset or split is an edit whatever the checkpoint: read first, the data's
    # check would have refused it as other data, and deleting data.json as told led to the
    # restore's "another run's checkpoint" (or the trainer's check of the edit)
    if isinstance(trained.get("data"), dict) and "dataset" in trained["data"]:
        refuse_edited_settings([change for change in changed_settings(trained, config)
                                if change.startswith(tuple(f"{name} " for name in
                                                           PART_SETTINGS))], run)
    sizing = {key: value for key, value in trained.items() if key not in UNSIZING_SECTIONS}
    if changed_settings(sizing, config):
        return state
    unsizing = {key: value for key, value in trained.items() if key in UNSIZING_SECTIONS}
    if not config.eval.ks and isinstance(unsizing.get("eval"), dict):
        unsizing["eval"] = {key: value for key, value in unsizing["eval"].items()
                            if key != "ks"}
    refuse_edited_settings(changed_settings(unsizing, config), run)
    return state


def refuse_edited_settings(changed: list[str], run: RunFolder) -> None:
    """Refuse, in one line naming the first, settings edited since the checkpoint that
    ``--resume`` cannot take (:func:`~kdml.training.resume_settings.changed_settings`)."""
    if changed:
        raise KdmlError(f"{run.config} was edited since its checkpoint: {first_of(changed)}; "
                        "--resume continues the run as it trained, and takes a change of "
                        f"{', '.join(sorted(RESUMABLE))} or a path-named data.dataset "
                        "only: put the setting back, or train a new run with it")


def _checkpoint_to_resume(run: RunFolder) -> dict[str, Any] | None:
    """The state a resumed run continues from: ``last.pt``'s, or ``unscored.pt``'s where the
    session before was stopped while it scored the epoch after ``last.pt``'s (the run then
    scores that epoch first). An ``unscored.pt`` of another epoch was superseded (a kill
    came between writing ``last.pt`` and removing it) and goes."""
    state = load_checkpoint(run.checkpoint) if run.checkpoint.exists() else None
    if run.unscored_checkpoint.exists():
        try:
            trained = load_checkpoint(run.unscored_checkpoint)
        except KdmlError:  # its own words would say "train again", losing last.pt's epochs
            raise KdmlError(f"{run.unscored_checkpoint}, an epoch trained but not yet scored, "
                            "is unreadable; delete it, and --resume trains that epoch "
                            "again") from None
        if trained.get("unscored") is not None and trained["epoch"] == (
                state["epoch"] if state is not None else 0) + 1:
            return trained
        run.unscored_checkpoint.unlink()
    return state


def recorded_unreadable(state: dict[str, Any], splits: DataSplits) -> dict[str, torch.Tensor]:
    """The positions in ``splits``' test (and gallery) part of the unreadable images that the
    last scoring before the checkpoint ``state`` left out (``data.on_bad_image=skip``), as
    :attr:`DataSplits.unreadable` holds them. ``{}`` for a checkpoint of a kdml before it
    recorded them (the "test set" line then counts the images listed, as it did); a part
    whose positions do not fit ``splits`` is left out alike."""
    sizes = {"test": len(splits.test), "gallery": len(splits.gallery or ())}
    return {part: positions for part, positions in (state.get("unreadable") or {}).items()
            if part in sizes and bool((positions < sizes[part]).all())}
