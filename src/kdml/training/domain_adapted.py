"""The composition flag: any recipe's method plus a domain MMD between source and target."""

from __future__ import annotations

from torch import Tensor, nn

from kdml.checks import Number, as_number, is_finite_number
from kdml.config import OptimConfig
from kdml.distributed import gather
from kdml.errors import KdmlError
from kdml.models.method import Method, StepOutput, detached
from kdml.seeding import StepRandom


class DomainAdaptedMethod(Method):
    r"""Any method plus :math:`\beta` times a domain MMD between source and target embeddings.

    .. math::
        L = L_{\mathrm{inner}}(x_s, y_s) + \beta\, D(f(x_s), f(x_t))

    The inner method is called as ``inner(inputs, labels)``; its ``StepOutput.embeddings`` (the
    source batch's) and ``inner.embed(target_inputs)`` enter ``mmd``. Everything else — test
    embeddings, parameter groups, proxies, ``chart_codes`` where the inner method has them — is
    the inner method's. Note that embedding the target batch in training mode also updates the
    inner network's BatchNorm statistics with target samples.

    Args:
        inner: the wrapped :class:`~kdml.models.method.Method` (returning embeddings).
        beta: weight of the discrepancy, a finite number >= 0 (or a 0-d tensor or array).
        mmd: e.g. :class:`~kdml.regularizers.domain.DomainMMD`.

    Example::

        >>> # method = DomainAdaptedMethod(jrd_method, beta=1.0, mmd=DomainMMD())
        >>> # method(source_x, source_y, target_inputs=target_x).terms["d_ts"]
    """

    uses_target = True

    def __init__(self, inner: Method, beta: Number, mmd: nn.Module) -> None:
        super().__init__()
        # a 0-d tensor or array: a float
        beta = as_number(beta, "DomainAdaptedMethod: beta")  # type: ignore[assignment]
        if not is_finite_number(beta, at_least=0):
            raise KdmlError(f"DomainAdaptedMethod: beta must be a finite number >= 0, got {beta!r}")
        self.inner = inner
        self.beta = float(beta)
        self.mmd = mmd

    @property
    def backbone(self) -> nn.Module:  # type: ignore[override]
        return self.inner.backbone

    @property
    def has_charts(self) -> bool:  # type: ignore[override]
        return self.inner.has_charts

    @property
    def augments_inputs(self) -> bool:  # type: ignore[override]
        return self.inner.augments_inputs

    @property
    def batch_needs(self) -> tuple[int, int, str]:
        return self.inner.batch_needs

    def chart_codes(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner.chart_codes(inputs)

    def forward(self, inputs: Tensor, labels: Tensor, target_inputs: Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        output = self.inner(inputs, labels, rng=rng)
        if target_inputs is None:
            if self.beta > 0:
                raise KdmlError(f"beta={self.beta} > 0 needs a target-domain batch")
            return output
        if output.embeddings is None:
            raise KdmlError(f"{type(self.inner).__name__} returns no embeddings; it cannot be "
                            "domain-adapted")
        discrepancy = self.mmd(gather(output.embeddings),
                               gather(self.inner.embed(target_inputs)))
        loss = output.loss + self.beta * discrepancy
        terms = {**output.terms, **detached(inner_loss=output.loss, d_ts=discrepancy,
                                            loss=loss)}
        return StepOutput(loss, terms, output.embeddings)

    def embed(self, inputs: Tensor) -> Tensor:
        return self.inner.embed(inputs)

    def proxy_parameters(self) -> list[nn.Parameter]:
        return self.inner.proxy_parameters()

    def param_groups(self, optim: OptimConfig) -> list[dict]:
        return self.inner.param_groups(optim)
