"""Training steps per second and peak memory with 1 and 2 processes (torch.distributed), and the
share of each step spent gathering the global batch for the batch regularizers.

Here: CPU processes with gloo, as the tests use. The same script on N GPUs (NCCL), e.g.:

    PYTHONPATH=src torchrun --standalone --nproc_per_node=8 benchmarks/distributed_scaling.py \\
        --device cuda --batch 800 --dataset folder:DIR --backbone bninception

(under torchrun it measures that one configuration; run alone, it launches 1 and 2 CPU
processes itself). Global batch fixed: every process count trains the same objective.

    PYTHONPATH=src .venv/bin/python benchmarks/distributed_scaling.py
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import machine_description
from measure import non_negative_count, one_line_kdml_errors, positive_count

from kdml import distributed
from kdml.config import resolve_config
from kdml.errors import KdmlError
from kdml.launch import launched_by_torchrun
from kdml.training.build import model_input_shape
from kdml.training.recipes import get_recipe
from kdml.training.trainer import Session


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Time ``args.steps`` training steps of the recipe on random images (this process's share
    of the global batch); the gathers are timed separately."""
    world = distributed.world()
    recipe = get_recipe(args.recipe)
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, overrides=[
        f"data.dataset={args.dataset}", f"data.batch_size={args.batch}",
        f"model.backbone={args.backbone}", "model.embedding_size=512",
        f"train.device={args.device}", "model.freeze_bn=true", f"data.image_size={args.size}",
        f"data.resize={max(args.size, 8)}"])
    session = Session.build(config, echo=lambda line: None)
    device = session.device
    local = args.batch // world.size
    generator = torch.Generator().manual_seed(world.rank)
    shape = model_input_shape(config, session.splits.train)
    images = torch.randn(local, *shape, generator=generator).to(device)
    labels = (torch.arange(local) + world.rank * local) % args.classes
    labels = labels.to(device)
    session.method.train()
    gather_seconds = [0.0]
    gather_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    real_gather = distributed.gather

    def timed_gather(x: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda":
            # events on the stream, read after the step's one synchronisation: a
            # synchronize here had counted the queued backbone forward as the gather's, and
            # added 4 host syncs to every timed step
            begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            begin.record()
            result = real_gather(x)
            end.record()
            gather_events.append((begin, end))
            return result
        start = time.perf_counter()  # gloo's CPU collectives return when done
        result = real_gather(x)
        gather_seconds[0] += time.perf_counter() - start
        return result

    import kdml.training.domain_adapted as domain_adapted
    import kdml.training.recipes.atlas as atlas_recipe
    import kdml.training.recipes.dtml as dtml_recipe
    import kdml.training.recipes.jrd as jrd_recipe

    # every training module's own reference to gather (each imported it by name; the sharded
    # JRS calls distributed.gather): timing JRD's alone had reported 0.0% for the Atlas and
    # DTML recipes, whose gathers it missed
    gathering = (jrd_recipe, atlas_recipe, dtml_recipe, domain_adapted, distributed)
    for module in gathering:
        module.gather = timed_gather  # type: ignore[attr-defined]
    times = []
    for step in range(args.warmup + args.steps):
        gather_seconds[0] = 0.0
        start = time.perf_counter()
        output = session.model(images, labels)
        session.optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        session.optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            gather_seconds[0] = sum(begin.elapsed_time(end) for begin, end in gather_events
                                    ) / 1000.0  # elapsed_time is in ms
            gather_events.clear()
        if step >= args.warmup:
            times.append((time.perf_counter() - start, gather_seconds[0]))
    for module in gathering:
        module.gather = real_gather  # type: ignore[attr-defined]
    step_time = statistics.median(t for t, _ in times)
    gather_time = statistics.median(g for _, g in times)
    with open("/proc/self/status") as status:
        peak = int(status.read().split("VmHWM:")[1].split()[0]) / 1024
    return {"step": step_time, "gather": gather_time, "peak_mib": peak}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, results) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(args.threads)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results[rank] = measure(args)
    except KdmlError as error:  # the parent says it in one line, not torch's quoted traceback
        results[rank] = {"error": str(error)}
    finally:
        distributed.teardown()


def report(world: int, per_rank: list[dict[str, float]], args: argparse.Namespace) -> str:
    step = max(result["step"] for result in per_rank)
    gather = max(result["gather"] for result in per_rank)
    peak = max(result["peak_mib"] for result in per_rank)
    return (f"| {world} | {args.batch // world} | {1000 * step:.1f} | {1 / step:.2f} | "
            f"{1000 * gather:.2f} | {100 * gather / step:.1f}% | {peak:.0f} |")


@one_line_kdml_errors
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="jrd")
    parser.add_argument("--backbone", default="cnn")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=positive_count, default=100, help="the global batch")
    parser.add_argument("--dataset", default="mnist5k",
                        help="whose labels and input shape to use (folder:DIR for photos)")
    parser.add_argument("--size", type=positive_count, default=224,
                        help="crop side for image files")
    parser.add_argument("--classes", type=positive_count, default=5)
    parser.add_argument("--steps", type=positive_count, default=20)
    parser.add_argument("--warmup", type=non_negative_count, default=3)
    parser.add_argument("--threads", type=positive_count, default=1,
                        help="torch threads per process")
    args = parser.parse_args()
    header = ("| processes | local batch | ms / step | steps / s | gather ms / step | "
              "gather share | peak RSS per process (MiB) |\n|---|---|---|---|---|---|---|")
    if launched_by_torchrun():
        distributed.setup(use_cuda=args.device == "cuda")
        result = measure(args)
        gathered = [None] * distributed.world().size
        dist.all_gather_object(gathered, result)
        if distributed.world().is_main:
            print(header)
            print(report(distributed.world().size, gathered, args))
        distributed.teardown()
        return
    print(f"{machine_description()}; torch {torch.__version__}; {args.recipe} with "
          f"{args.backbone} on {args.dataset}, global batch {args.batch}, {args.threads} "
          "thread(s) per process, gloo\n")
    print(header)
    for world in (1, 2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        results = mp.Manager().dict()
        mp.start_processes(_worker, args=(world, port, args, results), nprocs=world,
                           start_method="spawn")
        per_rank = [results[rank] for rank in range(world)]
        for result in per_rank:
            if "error" in result:
                raise KdmlError(result["error"])
        print(report(world, per_rank, args))


if __name__ == "__main__":
    main()
