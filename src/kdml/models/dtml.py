r"""The fully connected network of Deep Transfer Metric Learning (Hu, Lu & Tan, CVPR 2015).

DTML learns its metric with this network alone, from vectors (e.g. PCA'd LBP features); there
is no separate backbone. Every layer's output is kept because DSTML applies the criterion to the
hidden layers too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from kdml.checks import check_float_inputs, check_tensor_inputs, is_positive_int
from kdml.errors import KdmlError

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "identity": lambda x: x,
}
INITS = ("identity", "standard")


class DTMLNetwork(nn.Module):
    r"""The :math:`M`-layer network of DTML, Eq. 1 of Hu et al. (CVPR 2015).

    .. math::
        h^{(m)} = \varphi\left(W^{(m)} h^{(m-1)} + b^{(m)}\right), \qquad h^{(0)} = x,
        \qquad m = 1, \dots, M

    ``layer_sizes`` lists :math:`p^{(0)} = d, p^{(1)}, \dots, p^{(M)}` (the paper's
    "500-400-300" is ``[500, 400, 300]``: :math:`M = 2` weight layers). ``forward`` returns
    every layer's output :math:`[h^{(1)}, \dots, h^{(M)}]`; the top one is the embedding.

    ``init="identity"`` (default, as the authors do) puts ones on the diagonal of every
    (possibly rectangular) :math:`W^{(m)}` and zeros elsewhere and in :math:`b^{(m)}`, so the
    untrained network applies :math:`\varphi` M times to the first :math:`\min(p)` input
    coordinates (:math:`\tanh(\tanh(x))` for two layers);
    ``init="standard"`` keeps PyTorch's default ``nn.Linear`` initialisation.

    Args:
        layer_sizes: :math:`[d, p^{(1)}, \dots, p^{(M)}]`, at least two positive sizes.
        activation: :math:`\varphi`: ``"tanh"`` (paper), ``"sigmoid"``, ``"relu"`` or
            ``"identity"``. Default: ``"tanh"``.
        init: ``"identity"`` or ``"standard"``. Default: ``"identity"``.

    Inputs: ``x`` of shape :math:`(N, d)`; extra dimensions are flattened (:math:`(N, 1, 8, 8)`
    images become :math:`(N, 64)`).

    Shape: a list of :math:`M` tensors, the :math:`m`-th of shape :math:`(N, p^{(m)})`.

    Example::

        >>> net = DTMLNetwork([6, 5, 3])
        >>> [h.shape for h in net(torch.zeros(4, 6))]
        [torch.Size([4, 5]), torch.Size([4, 3])]
        >>> net.feature_size, net.weight_penalty().item()  # ||I_5x6||^2 + ||I_3x5||^2
        (3, 8.0)
    """

    def __init__(self, layer_sizes: Sequence[int], activation: str = "tanh",
                 init: str = "identity") -> None:
        super().__init__()
        sizes = list(layer_sizes) if isinstance(layer_sizes, Sequence) else []
        if len(sizes) < 2 or not all(is_positive_int(s) for s in sizes):
            raise KdmlError(f"DTMLNetwork needs at least two positive layer sizes "
                            f"[input, ..., top], got {layer_sizes!r}")
        if activation not in ACTIVATIONS:
            raise KdmlError(f"unknown activation {activation!r}; choose one of "
                            f"{', '.join(ACTIVATIONS)}")
        if init not in INITS:
            raise KdmlError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")
        self.layer_sizes = tuple(int(s) for s in sizes)
        self.activation = activation
        self.init = init
        self.layers = nn.ModuleList(nn.Linear(p_in, p_out)
                                    for p_in, p_out in zip(sizes[:-1], sizes[1:], strict=True))
        self.feature_size = sizes[-1]
        if init == "identity":
            self.reset_to_identity()

    @torch.no_grad()
    def reset_to_identity(self) -> None:
        """Ones on the diagonal of every :math:`W^{(m)}`, zeros elsewhere and in the biases."""
        for layer in self.linear_layers():
            nn.init.eye_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> list[Tensor]:
        phi = ACTIVATIONS[self.activation]
        check_tensor_inputs("DTMLNetwork", [x], "features")
        if x.ndim < 2:
            raise KdmlError(f"DTMLNetwork expects a batch [N, {self.layer_sizes[0]}], got "
                            f"{tuple(x.shape)}; a single sample is x[None]")
        check_float_inputs("DTMLNetwork", [x], "features")
        hidden = x.flatten(1)
        if hidden.shape[1] != self.layer_sizes[0]:
            raise KdmlError(f"DTMLNetwork expects {self.layer_sizes[0]} input features, "
                            f"got {hidden.shape[1]}")
        outputs = []
        for layer in self.layers:
            hidden = phi(layer(hidden))
            outputs.append(hidden)
        return outputs

    def embed(self, x: Tensor) -> Tensor:
        """The top layer's output :math:`f^{(M)}(x)`, shape :math:`(N, p^{(M)})`."""
        return self(x)[-1]

    @property
    def num_layers(self) -> int:
        """:math:`M`, the number of weight layers."""
        return len(self.layers)

    def weight_penalty(self) -> Tensor:
        r""":math:`\sum_m \|W^{(m)}\|_F^2 + \|b^{(m)}\|_2^2`, the :math:`\gamma` term of Eq. 7."""
        return self.layer_penalties().sum()

    def layer_penalties(self) -> Tensor:
        r""":math:`\|W^{(m)}\|_F^2 + \|b^{(m)}\|_2^2` of each layer, shape :math:`(M,)`, bottom
        first: DSTML's hidden criteria (Eq. 13) each carry their own layer's."""
        return torch.stack([layer.weight.pow(2).sum() + layer.bias.pow(2).sum()
                            for layer in self.linear_layers()])

    def linear_layers(self) -> list[nn.Linear]:
        """The :math:`M` weight layers :math:`W^{(m)}, b^{(m)}`, bottom first."""
        return [layer for layer in self.layers if isinstance(layer, nn.Linear)]

    def extra_repr(self) -> str:
        sizes = "-".join(map(str, self.layer_sizes))
        return f"sizes={sizes}, activation={self.activation}, init={self.init}"
