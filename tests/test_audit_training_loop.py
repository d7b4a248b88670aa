"""The training loop's steps and its checkpoint's state, from a mutation audit of
kdml.training (trainer, checkpoint, selection, recorder, resume_state): each test failed on a
mutant of the loop that every other test let pass."""

from __future__ import annotations

import copy

import pytest
import torch

from kdml import cli
from kdml.config import resolve_config
from kdml.seeding import StepRandom
from kdml.training.recipes import get_recipe


def session_of(*overrides):
    from kdml.training.trainer import Session

    spec = get_recipe("amsoftmax")
    config = resolve_config(spec.name, spec.params, spec.defaults, None,
                            ["train.device=cpu", "model.embedding_size=8", "eval.nmi=false",
                             "model.backbone=mlp", "data.num_workers=0", "data.batch_size=20",
                             *overrides])
    return Session.build(config, echo=lambda line: None)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_each_step_is_one_update_of_its_own_batch_s_gradient(optimizer):
    """Step k updates the weights once with the gradient of step k's batch alone, as a plain
    loop (zero_grad, backward, step) over the same batches computes it: zero_grad moved after
    the backward (no update at all: the model never trained) had passed every test."""
    from kdml.training.trainer import train_one_epoch

    session = session_of("train.steps_per_epoch=3", f"optim.name={optimizer}", "optim.lr=0.05",
                         "train.seed=4")
    method, reference = session.method, copy.deepcopy((session.method, session.optimizer))
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    method.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append((args[0].clone(), args[1].clone())),
        with_kwargs=True)
    before = {name: value.clone() for name, value in method.state_dict().items()}
    train_one_epoch(session, 2, progress=False)
    assert len(batches) == 3

    model, optim = reference
    for step, (inputs, labels) in enumerate(batches):
        optim.zero_grad(set_to_none=True)
        model(inputs, labels, rng=StepRandom(4, 2, step)).loss.backward()
        optim.step()
    trained, expected = method.state_dict(), model.state_dict()
    assert any(not torch.equal(trained[name], before[name]) for name in trained)
    for name in trained:
        torch.testing.assert_close(trained[name], expected[name], rtol=1e-6, atol=1e-7,
                                   msg=name)


def test_a_checkpoint_is_finished_after_the_last_planned_epoch_and_not_before(tmp_path,
                                                                              monkeypatch):
    """last.pt's "finished" is true once train.epochs are trained (and only then), and
    "stopped_early" only where a rule stopped the run: "finished" set only by the stopping
    rules had passed every test (nothing reads it today where "stopped_early" is recorded)."""
    from kdml.training import recorder

    saved: list[tuple[int, bool, bool]] = []
    real_save = recorder.save_checkpoint

    def kept_save(state, path):
        if path.name == "last.pt":
            saved.append((state["epoch"], state["finished"], state["stopped_early"]))
        real_save(state, path)

    monkeypatch.setattr(recorder, "save_checkpoint", kept_save)
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(tmp_path / "run"),
                     "train.epochs=2", "data.batch_size=20", "model.embedding_size=8",
                     "eval.nmi=false", "train.device=cpu", "train.steps_per_epoch=1",
                     "--no-progress"]) == 0
    assert saved == [(1, False, False), (2, True, False)]


def test_a_rank_s_non_finite_first_step_is_the_earliest_step_over_the_ranks():
    """earliest_non_finite: a rank whose first step (step 0) went non-finite is the earliest,
    whatever the others met; step 0 taken for "none" (only step -1 is) had passed every
    test, and under torchrun a run diverged at its first step named a later one."""
    from kdml.training.nonfinite import earliest_non_finite

    step, bad = earliest_non_finite(torch.tensor([[-1, 0, 0], [3, 0, 1], [0, 1, 0]]))
    assert (int(step), bad.tolist()) == (0, [True, False])
    step, bad = earliest_non_finite(torch.tensor([[-1, 0, 0], [-1, 0, 0]]))
    assert (int(step), bad.tolist()) == (-1, [False, False])


def test_the_deterministic_block_gives_back_torch_s_warn_only_mode():
    """A caller's deterministic algorithms in warn-only mode are warn-only again after the
    block: restoring the mode without warn_only (errors instead of warnings for the caller's
    later work) had passed every test."""
    from kdml.training.determinism import deterministic_mode

    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        with deterministic_mode(True):
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


class _Linear(torch.nn.Module):
    """A tiny inner method: a fixed linear map and the squared embedding as its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Linear(4, 3).double()
        with torch.no_grad():
            self.backbone.weight.copy_(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))
            self.backbone.bias.fill_(0.1)

    def forward(self, inputs, labels, target_inputs=None, *, rng=None):
        from kdml.models.method import StepOutput

        embeddings = self.backbone(inputs)
        loss = embeddings.pow(2).mean()
        return StepOutput(loss, {"loss": loss.detach()}, embeddings)

    def embed(self, inputs):
        return self.backbone(inputs)


def test_the_domain_term_s_gradient_flows_through_the_target_embeddings_too():
    """beta * D(f(x_s), f(x_t)) is trained through both embeddings: the gradient of the
    method's loss is that of the inner loss plus beta times the discrepancy, computed here with
    both sides differentiable. The target side detached (only the source moving towards it)
    had passed every test."""
    from kdml.models.method import Method
    from kdml.regularizers.domain import DomainMMD
    from kdml.training.domain_adapted import DomainAdaptedMethod

    class Inner(_Linear, Method):
        pass

    generator = torch.Generator().manual_seed(3)
    source = torch.randn(6, 4, dtype=torch.float64, generator=generator)
    target = torch.randn(6, 4, dtype=torch.float64, generator=generator) * 2 + 1
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    inner = Inner()
    method = DomainAdaptedMethod(inner, 0.7, DomainMMD())
    method(source, labels, target_inputs=target).loss.backward()
    reference = _Linear()
    embedded = reference.backbone(source)
    loss = embedded.pow(2).mean() + 0.7 * DomainMMD()(embedded, reference.backbone(target))
    loss.backward()
    for got, expected in zip(inner.backbone.parameters(), reference.backbone.parameters(),
                             strict=True):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-12, atol=1e-14)
