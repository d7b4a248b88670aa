"""Find the first step whose loss is not finite, without a host sync on every step."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from kdml import distributed
from kdml.errors import KdmlError


class NonFiniteLoss(KdmlError):
    """Training stopped because a loss term became NaN or infinite: the run diverged."""


class NonFiniteWatch:
    """Records, on the terms' device, the first step at which a loss term was NaN or infinite;
    :meth:`check` reads it back (one sync) and stops training with a one-line error.

    The trainer calls :meth:`check` every ``check_every`` steps and at the end of each epoch,
    before the checkpoint is written, so the last checkpoint always holds finite parameters.
    Under torchrun every rank calls it at the same steps, and the ranks agree there on the
    earliest non-finite step of any of them (one collective, at the read's host sync): a rank
    that had stopped alone said nothing (only rank 0 prints an error every rank meets), and
    rank 0 reported a failed collective.

    Args:
        check_every: steps between reads (1 on the CPU in one process, where a read costs
            nothing: :func:`kdml.training.trainer.nonfinite_check_every`).
        precision: ``train.precision``; under ``fp16`` the advice names float16's range.
    """

    def __init__(self, check_every: int, precision: str = "fp32") -> None:
        self.check_every = check_every
        self.precision = precision
        self.names: list[str] = []
        self.first_step: Tensor | None = None  # -1 until a step goes non-finite
        self.first_bad: Tensor | None = None  # [T] bool: which terms were non-finite then

    def observe(self, step: int, terms: dict[str, Tensor]) -> None:
        values = torch.stack([value.detach().float() for value in terms.values()])
        bad = ~torch.isfinite(values)
        if self.first_step is None or self.first_bad is None:
            self.names = list(terms)
            self.first_step = torch.full((), -1, dtype=torch.long, device=values.device)
            self.first_bad = torch.zeros_like(bad)
        is_first = (self.first_step < 0) & bad.any()
        self.first_step = torch.where(is_first, step, self.first_step)
        self.first_bad = torch.where(is_first, bad, self.first_bad)

    def due(self, step: int) -> bool:
        return (step + 1) % self.check_every == 0

    def check(self, epoch: int) -> None:
        """Raise if a step so far went non-finite (a host sync)."""
        if self.first_step is None or self.first_bad is None:
            return
        first_step, first_bad = self.first_step, self.first_bad
        if distributed.world().is_distributed:
            rows = torch.cat([first_step.view(1), first_bad.long()])
            first_step, first_bad = earliest_non_finite(distributed.gather(rows[None]))
        step = int(first_step)
        if step < 0:
            return
        bad = [name for name, is_bad in zip(self.names, first_bad.tolist(), strict=True)
               if is_bad]
        culprit = next((name for name in bad if name != "loss"), bad[0])
        advice = FLOAT16_ADVICE if self.precision == "fp16" else ADVICE
        raise NonFiniteLoss(f"training stopped: the {culprit!r} term became NaN or infinite at "
                            f"epoch {epoch}, step {step + 1}; {kept_checkpoint(epoch)}. {advice}")

    @staticmethod
    def check_weights(state: Iterable[Tensor], epoch: int, steps: int) -> None:
        """Raise if the epoch's last update left a parameter or a floating-point buffer (e.g.
        BatchNorm's running statistics) NaN or infinite (a host sync), before the epoch's
        checkpoint keeps it. Every other update is seen by the next step's loss."""
        finite = [tensor.detach().isfinite().all() for tensor in state
                  if tensor.is_floating_point()]
        if finite and not bool(torch.stack(finite).all()):
            raise NonFiniteLoss(f"training stopped: the weights became NaN or infinite in the "
                                f"update of epoch {epoch}, step {steps}; "
                                f"{kept_checkpoint(epoch)}. {ADVICE}")


def earliest_non_finite(rows: Tensor) -> tuple[Tensor, Tensor]:
    """The first non-finite step over the ranks, from each rank's ``[step, *bad]`` row of
    ``rows`` (``[R, 1 + T]``; step -1 where none was): that step (-1 where no rank had one)
    and which terms were non-finite then on any rank that met it. On the rows' device, no
    host sync.

    Example:
        >>> step, bad = earliest_non_finite(torch.tensor([[-1, 0, 0], [4, 0, 1], [2, 1, 0]]))
        >>> int(step), bad.tolist()
        (2, [True, False])
    """
    steps = rows[:, 0]
    never = torch.iinfo(steps.dtype).max
    steps = torch.where(steps >= 0, steps, never)
    earliest = steps.min()
    bad = (rows[:, 1:].bool() & (steps == earliest)[:, None]).any(dim=0)
    return torch.where(earliest == never, -1, earliest), bad


ADVICE = "Lower the learning rates or the regularizer weight and train again"
# float16 ends at 65504: inputs or activations beyond it overflow from the first step, before
# any update a lower learning rate could change (features of size 1e5 had been told to)
FLOAT16_ADVICE = ("Under train.precision=fp16 a value beyond float16's range (65504) overflows "
                  "too: train with train.precision=bf16 or fp32, or lower the learning rates "
                  "or the regularizer weight and train again")


def kept_checkpoint(epoch: int) -> str:
    """What the run folder still holds when ``epoch`` stops training."""
    return (f"the run folder keeps epoch {epoch - 1}'s checkpoint" if epoch > 1 else
            "no epoch finished, so the run folder holds no checkpoint")
