"""Speed benchmarks of kdml, printed as markdown tables.

Section ``train_step``: a whole training step of the ``jrd`` recipe against ``amsoftmax``
(JRD without the regularizer) on the default CPU backbone: the regularizer's overhead.

Section ``regularizer``: forward + backward of the JRS regularizer (JRD, Chu et al., ICML 2020,
Eq. 10 / 11) at the paper's scale: a batch of M = 100 samples, 10 per class; pooled features
1024-d (3-Gaussian mixture), embedding 512-d (3-Gaussian mixture), class level C = 100
(cosines to 100 class proxies, 1 Gaussian). It compares ``kdml``'s
:class:`~kdml.regularizers.JointRepresentationSimilarity` with

- the authors' formulation: three full M x M kernel matrices, each with its own adaptive
  bandwidth, multiplied, then a masked mean with a boolean mask built from the labels
  (re-implemented here);
- a literal Eq. 10 that loops over the ordered class pairs.

Only the regularizer is timed (the representations are leaf tensors), not a network.

Section ``ops``: how many operators one step dispatches, counted below autograd (so backward
ops count too), split into views (no kernel) and the rest (at least one kernel each on a
GPU): JRS alone at the paper's scale, and whole ``amsoftmax`` and ``jrd`` steps. A count does
not depend on the machine's load; what the launches cost on a GPU must be measured there.

Each section is a function ``(args) -> markdown`` registered in ``SECTIONS``; ``--sections``
picks which ones run.

Usage::

    PYTHONPATH=src python benchmarks/jrs_speed.py [--device cpu|cuda] [--threads N]
        [--clock wall|cpu] [--rounds 10] [--sections regularizer]

On a machine shared with other jobs, ``--threads 1 --clock cpu`` gives the steadiest figures.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
import timeit
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from measure import non_negative_count, positive_count
from recipe_step import training_step
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.benchmark import Timer

from kdml.kernels import GaussianMixtureKernel
from kdml.regularizers import JointIntra, JointMMD, JointRepresentationSimilarity

MULTIPLIER = 2.0
# wall: elapsed time (the usual figure, needs an idle machine); cpu: CPU time of this process,
# all threads summed, which other processes on a shared machine barely disturb
CLOCKS: dict[str, Callable[[], float]] = {"wall": timeit.default_timer, "cpu": time.process_time}


# ----------------------------------------------------------------------------- references


def _mixture_from_sq_dists(sq_dists: Tensor, tau: Tensor, num_kernels: int) -> Tensor:
    bandwidths = [tau * MULTIPLIER ** (i - num_kernels // 2) for i in range(num_kernels)]
    return sum(torch.exp(-sq_dists / bw) for bw in bandwidths) / num_kernels


def _sq_dists(a: Tensor, b: Tensor) -> Tensor:
    """The usual expansion ||a||^2 + ||b||^2 - 2 a.b (as in the authors' code)."""
    return a.pow(2).sum(dim=1)[:, None] + b.pow(2).sum(dim=1)[None, :] - 2.0 * a @ b.T


def _adaptive_tau(sq_dists: Tensor) -> Tensor:
    m = sq_dists.shape[0]
    return sq_dists.detach().sum() / (m * m - m)


def authors_formulation(
    representations: Sequence[Tensor], labels: Tensor, kernel_counts: Sequence[int]
) -> Tensor:
    """One full M x M Gaussian-mixture matrix per layer (own adaptive bandwidth), their
    element-wise product, and the mean over a boolean inter-class mask."""
    joint = None
    for rep, num_kernels in zip(representations, kernel_counts, strict=True):
        sq_dists = _sq_dists(rep, rep)
        layer = _mixture_from_sq_dists(sq_dists, _adaptive_tau(sq_dists), num_kernels)
        joint = layer if joint is None else joint * layer
    inter_class = labels[:, None] != labels[None, :]
    return joint[inter_class].mean()


def eq10_class_pair_loop(
    representations: Sequence[Tensor], labels: Tensor, kernel_counts: Sequence[int]
) -> Tensor:
    """Eq. 10 / N_pairs literally: for every ordered class pair (I, J), I != J, the sum over
    i in I, j in J of the product of the layer kernels (bandwidths from the whole batch)."""
    taus = [_adaptive_tau(_sq_dists(rep, rep)) for rep in representations]
    classes = labels.unique().tolist()
    members = {c: (labels == c).nonzero().squeeze(1) for c in classes}
    total, num_pairs = representations[0].new_zeros(()), 0
    for class_i in classes:
        for class_j in classes:
            if class_i == class_j:
                continue
            block = None
            for rep, tau, num_kernels in zip(representations, taus, kernel_counts, strict=True):
                a, b = rep[members[class_i]], rep[members[class_j]]
                sq_dists = _sq_dists(a, b)
                layer = _mixture_from_sq_dists(sq_dists, tau, num_kernels)
                block = layer if block is None else block * layer
            total = total + block.sum()
            num_pairs += block.numel()
    return total / num_pairs


# ----------------------------------------------------------------------------- helpers


def make_jrd_batch(args: argparse.Namespace) -> tuple[list[Tensor], Tensor]:
    """Random representations shaped like JRD's: non-negative pooled features, L2-normalised
    embeddings, and cosines to L2-normalised class proxies. All are leaf tensors."""
    gen = torch.Generator().manual_seed(args.seed)
    num_samples = args.classes_per_batch * args.samples_per_class
    pooled = torch.randn(num_samples, args.pool_dim, generator=gen).relu()
    embedding = F.normalize(torch.randn(num_samples, args.embedding_dim, generator=gen), dim=1)
    proxies = F.normalize(torch.randn(args.num_classes, args.embedding_dim, generator=gen), dim=1)
    class_level = embedding @ proxies.T
    labels = torch.arange(args.classes_per_batch).repeat_interleave(args.samples_per_class)
    reps = [t.to(args.device).requires_grad_() for t in (pooled, embedding, class_level)]
    return reps, labels.to(args.device)


def time_interleaved(
    steps: dict[str, Callable[[], None]], args: argparse.Namespace
) -> dict[str, tuple[float, float, float]]:
    """Median, first and third quartile (ms) of every step.

    The steps are timed round-robin (``args.rounds`` rounds of ``torch.utils.benchmark``'s
    ``blocked_autorange``, after ``args.warmup`` untimed runs each), so that load from other
    processes and clock drift hit all of them alike; the figures summarise the per-round
    medians.
    """
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    clock = CLOCKS[args.clock]
    if str(args.device).startswith("cuda"):  # a timer= replaces torch's, which synchronises
        unsynchronised = clock

        def clock() -> float:
            torch.cuda.synchronize()
            return unsynchronised()

    round_medians: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            timer = Timer(
                stmt="step()", globals={"step": step}, num_threads=args.threads, timer=clock
            )
            measurement = timer.blocked_autorange(min_run_time=args.min_run_time)
            round_medians[name].append(measurement.median * 1e3)
    summary = {}
    for name, values in round_medians.items():
        # inclusive: quartiles within the values (the default extrapolates: negative times
        # from two rounds)
        q1, median, q3 = (statistics.quantiles(values, n=4, method="inclusive")
                          if len(values) > 1 else values * 3)
        summary[name] = (median, q1, q3)
    return summary


def time_forward_backward(
    cases: dict[str, Callable[[list[Tensor], Tensor], Tensor]],
    reps: list[Tensor],
    labels: Tensor,
    args: argparse.Namespace,
) -> dict[str, tuple[float, float, float]]:
    """:func:`time_interleaved` of one forward + backward of every regularizer."""

    def forward_backward(regularizer) -> Callable[[], None]:
        return lambda: torch.autograd.grad(regularizer(reps, labels), reps)

    return time_interleaved({name: forward_backward(reg) for name, reg in cases.items()}, args)


class OperatorCounter(TorchDispatchMode):
    """Counts the operators that reach the backend, views apart. torch's FlopCounterMode is
    built the same way but counts only FLOPs, not calls, so it cannot serve here."""

    def __init__(self) -> None:
        super().__init__()
        self.views = 0
        self.kernels: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            self.views += 1
        else:
            self.kernels[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_operators(step: Callable[[], None]) -> OperatorCounter:
    step()  # a first call builds lazy state (optimizer moments) that later steps do not
    with OperatorCounter() as counter:
        step()
    return counter


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- sections


def regularizer_section(args: argparse.Namespace) -> str:
    """JRS forward + backward: kdml vs the authors' formulation vs a class-pair loop."""
    reps, labels = make_jrd_batch(args)
    kernel_counts = (3, 3, 1)  # pooling, embedding, class level (JRD, Sec. 5.1)
    kernels = [GaussianMixtureKernel(k, MULTIPLIER) for k in kernel_counts]
    candidates: dict[str, Callable[[list[Tensor], Tensor], Tensor]] = {
        "kdml `JointRepresentationSimilarity`": JointRepresentationSimilarity(kernels),
        "authors' formulation (3 full kernels, masked mean)": lambda r, y: authors_formulation(
            r, y, kernel_counts
        ),
        "literal Eq. 10, loop over class pairs": lambda r, y: eq10_class_pair_loop(
            r, y, kernel_counts
        ),
    }
    extras = {
        "kdml `JointMMD` (baseline, Eq. 15)": JointMMD(kernels),
        "kdml `JointIntra` (baseline, Eq. 16)": JointIntra(kernels),
    }

    # all JRS implementations must agree before their speed means anything
    values = {name: fn(reps, labels).item() for name, fn in candidates.items()}
    reference = values["kdml `JointRepresentationSimilarity`"]
    for name, value in values.items():
        if abs(value - reference) > 1e-4 * abs(reference) + 1e-7:
            raise RuntimeError(f"{name} gives {value}, kdml gives {reference}")

    timings = time_forward_backward({**candidates, **extras}, reps, labels, args)
    kdml_ms = timings["kdml `JointRepresentationSimilarity`"][0]
    rows = [
        [name, f"{median:.3f}", f"{q1:.3f} - {q3:.3f}", f"{median / kdml_ms:.2f}x"]
        for name, (median, q1, q3) in timings.items()
    ]
    setup = (
        f"JRS forward + backward, M = {len(labels)} ({args.classes_per_batch} classes x "
        f"{args.samples_per_class}), pooled {args.pool_dim}-d (3 Gaussians), embedding "
        f"{args.embedding_dim}-d (3 Gaussians), class level {args.num_classes}-d (1 Gaussian); "
        f"device {args.device}, float32, torch {torch.__version__}, {args.threads} thread(s), "
        f"{args.clock} clock; "
        f"JRS value {reference:.6f}. Median (and quartiles) over {args.rounds} interleaved "
        f"rounds of per-round median times."
    )
    header = ["implementation", "median ms", "quartiles ms", "time / kdml JRS"]
    return setup + "\n\n" + markdown_table(header, rows)


def recipe_steps(args: argparse.Namespace) -> dict[str, Callable[[], None]]:
    """One training step (forward, backward, Adam) of ``amsoftmax`` and of ``jrd``, as the
    trainer builds them with their defaults on the default CPU backbone for mnist5k."""
    from kdml.models.backbones import build_backbone

    gen = torch.Generator().manual_seed(args.seed)
    images = torch.rand(args.step_batch, 1, 28, 28, generator=gen)  # mnist5k's input shape
    labels = torch.arange(args.step_batch) % args.step_classes
    steps: dict[str, Callable[[], None]] = {}
    for name in ("amsoftmax", "jrd"):
        torch.manual_seed(args.seed)
        steps[name] = training_step(name, build_backbone("cnn", (1, 28, 28)), images, labels,
                                    args.step_classes)
    return steps


def train_step_section(args: argparse.Namespace) -> str:
    """Whole training step of ``jrd`` vs ``amsoftmax`` (see :func:`recipe_steps`)."""
    timings = time_interleaved(recipe_steps(args), args)
    base = timings["amsoftmax"][0]
    rows = [[name, f"{median:.1f}", f"{q1:.1f} - {q3:.1f}", f"{100 * (median / base - 1):+.1f}%"]
            for name, (median, q1, q3) in timings.items()]
    setup = (f"One training step (forward, backward, Adam step) on the default CPU backbone "
             f"(SmallCNN, 1x28x28 mnist5k inputs), batch {args.step_batch} of "
             f"{args.step_classes} classes, recipe defaults (embedding 64, JRS over pool 128-d, "
             f"emb 64-d, cls {args.step_classes}-d); {args.threads} thread(s), {args.clock} "
             f"clock, median over {args.rounds} interleaved rounds.")
    header = ["recipe", "median ms", "quartiles ms", "vs amsoftmax"]
    return setup + "\n\n" + markdown_table(header, rows)


def ops_section(args: argparse.Namespace) -> str:
    """Operators dispatched by JRS alone (paper scale) and by whole amsoftmax / jrd steps."""
    reps, labels = make_jrd_batch(args)
    jrs = JointRepresentationSimilarity([GaussianMixtureKernel(k, MULTIPLIER) for k in (3, 3, 1)])
    cases = {"JRS forward + backward (paper scale)":
             lambda: torch.autograd.grad(jrs(reps, labels), reps)}
    cases |= {f"`{name}` training step (SmallCNN, batch {args.step_batch})": step
              for name, step in recipe_steps(args).items()}
    rows = []
    for name, step in cases.items():
        counter = count_operators(step)
        common = ", ".join(f"{op} {n}" for op, n in counter.kernels.most_common(5))
        rows.append([name, str(sum(counter.kernels.values())), str(counter.views), common])
    setup = ("Operators dispatched in one call, counted below autograd (forward and backward), "
             f"on {args.device}, torch {torch.__version__}. Every non-view operator launches at "
             "least one kernel on a GPU; views launch none.")
    header = ["step", "operators (kernels)", "views", "most frequent"]
    return setup + "\n\n" + markdown_table(header, rows)


SECTIONS: dict[str, Callable[[argparse.Namespace], str]] = {
    "regularizer": regularizer_section,
    "train_step": train_step_section,
    "ops": ops_section,
}


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=positive_count, default=torch.get_num_threads())
    parser.add_argument(
        "--clock", choices=list(CLOCKS), default="wall", help="wall time or process CPU time"
    )
    parser.add_argument("--rounds", type=positive_count, default=10,
                        help="interleaved timing rounds")
    parser.add_argument(
        "--min-run-time", type=float, default=0.3, help="seconds per case and round"
    )
    parser.add_argument("--warmup", type=non_negative_count, default=10,
                        help="untimed runs per case")
    parser.add_argument("--seed", type=int, default=0)

    jrs = parser.add_argument_group("regularizer section (JRD paper scale)")
    jrs.add_argument("--classes-per-batch", type=positive_count, default=10)
    jrs.add_argument("--samples-per-class", type=positive_count, default=10)
    jrs.add_argument("--pool-dim", type=positive_count, default=1024)
    jrs.add_argument("--embedding-dim", type=positive_count, default=512)
    jrs.add_argument("--num-classes", type=positive_count, default=100,
                     help="class-level dimension C")
    step = parser.add_argument_group("train_step section (jrd vs amsoftmax)")
    step.add_argument("--step-batch", type=positive_count, default=64,
                      help="the trainer's default batch")
    step.add_argument("--step-classes", type=positive_count, default=5,
                      help="mnist5k's training classes")
    args = parser.parse_args(argv)
    refuse_unusable_device(parser, args.device)
    return args


def refuse_unusable_device(parser: argparse.ArgumentParser, device: str) -> None:
    """Stop in one line on a device name torch does not know, or on CUDA where there is none
    (torch's traceback had come once the first section built its tensors)."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        parser.error(f"argument --device: {device!r} is not a device (cpu or cuda)")
    if kind == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: {device}, but no CUDA device is available here; "
                     "use cpu")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    for name in args.sections:
        print(f"## {name}\n\n{SECTIONS[name](args)}\n")


if __name__ == "__main__":
    main()
