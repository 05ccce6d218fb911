"""Train the digits CNN as an elastic job that survives checkpoint-restart rescales.

The platform rescales an elastic job by halting every learner (SIGTERM), letting them
checkpoint and exit 0, and redeploying the job with a new number of learners
(``NUM_LEARNERS``/``WORLD_SIZE``), ``FFDL_GPUS`` and global batch size (``FFDL_BATCH_SIZE``).
This script owns the training side of that contract:

- with ``WORLD_SIZE`` > 1 it trains data-parallel (gloo, ``DistributedDataParallel``), each
  rank taking its slice of every global batch, so one step sees the same global batch
  whatever the number of learners;
- a slice larger than one GPU holds (``elastic.local_batch_size.max``) runs as the
  ``FFDL_ACCUMULATION_STEPS`` micro-batches the platform asks for, their gradients summed
  before one exchange and one optimizer step (the manifest says
  ``accumulate_gradients: true``), so a batch of 128 fits one learner;
- the learning rate follows the linear scaling rule, ``lr = BASE_LR * batch / BASE_BATCH``
  (0.002 at the base batch of 64), decayed over the run by a cosine schedule;
- with ``elastic.rebatch_in_place: true`` the platform may change the batch without a
  restart: at each epoch boundary rank 0 reads the batch it is told now (``context()``),
  every rank takes it, and the learning rate follows;
- rank 0 checkpoints at every epoch end and every rank resumes from the newest checkpoint;
- all ranks agree on stopping at each epoch boundary, so a halt never splits the gang.

Data: ``$DATA_DIR/digits.npz`` (arrays ``images`` and ``target``) when staged, else
scikit-learn's bundled copy (no download).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# Must precede the imports that load an OpenMP runtime. With the default busy-waiting,
# learners sharing CPUs spin instead of working (see examples/digits/train.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ffdl.sdk.api import (
    JobContext,
    context,
    install_stop_handler,
    load_checkpoint,
    report,
    save_checkpoint,
    should_stop,
)

SEED = 0
NUM_CLASSES = 10
STAGED_DATA_FILE = "digits.npz"
# The learning rate that trains well at the base batch; other batches scale it linearly.
BASE_LR = 2e-3
BASE_BATCH = 64
# Bounded so that a learner whose peer never starts fails instead of waiting half an hour.
RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=180)


@dataclass(frozen=True)
class Gang:
    """This process's place in the data-parallel group (a gang of one when not distributed)
    and how it runs its slice of a global batch."""

    rank: int
    world_size: int
    job: JobContext

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


@dataclass
class EpochResult:
    loss: float
    accuracy: float
    samples: int


@dataclass
class Progress:
    """Where training stands: what the next checkpoint records and a resume continues from."""

    completed_epochs: int = 0
    samples: int = 0
    checkpointed_epoch: int | None = None
    saved_rng: torch.Tensor | None = None


def parse_arguments(job: JobContext) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    # The platform sets FFDL_BATCH_SIZE (the global batch) and changes it on a rescale.
    parser.add_argument("--batch-size", type=int, default=job.batch_size or BASE_BATCH)
    parser.add_argument("--base-lr", type=float, default=BASE_LR)
    return parser.parse_args()


def batch_now(gang: Gang, current: int) -> tuple[int, JobContext]:
    """The global batch to train the next epoch with, and the context that splits it into
    micro-batches: what the platform tells the job now (a batch changed in place), else
    ``current``. Rank 0's reading, sent to every rank, so that the gang never disagrees."""
    job = context()
    told = [job.batch_size or current, job.micro_batch_size or 0, job.accumulation_steps]
    if gang.distributed:
        values = torch.tensor(told, dtype=torch.int64)
        dist.broadcast(values, src=0)
        told = [int(value) for value in values]
    batch, micro, steps = told
    return batch, replace(
        gang.job, batch_size=batch, micro_batch_size=micro or None, accumulation_steps=steps
    )


def scaled_learning_rate(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule: a batch k times larger makes k times fewer steps per epoch, so
    each step is made k times larger to keep the progress per sample comparable."""
    return base_lr * global_batch / BASE_BATCH


def epoch_learning_rate(peak_lr: float, epoch: int, epochs: int) -> float:
    """Cosine decay from ``peak_lr`` over the run. Ending on small steps settles the model,
    so the final accuracy depends little on where rescales changed the batch size."""
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * (epoch - 1) / epochs))


def join_gang(job: JobContext) -> Gang:
    gang = Gang(rank=job.rank, world_size=job.world_size, job=job)
    if gang.distributed:
        # MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE come from the platform (env://).
        dist.init_process_group(
            "gloo",
            init_method="env://",
            rank=gang.rank,
            world_size=gang.world_size,
            timeout=RENDEZVOUS_TIMEOUT,
        )
    return gang


def leave_gang(gang: Gang) -> None:
    if gang.distributed:
        dist.destroy_process_group()


def load_images_and_labels(
    data_dir: Path, gang: Gang
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    staged = data_dir / STAGED_DATA_FILE
    if staged.is_file():
        with np.load(staged) as arrays:
            images, labels = arrays["images"], arrays["target"]
        source = str(staged)
    else:
        bundled = load_digits()
        images, labels = bundled.images, bundled.target
        source = "scikit-learn bundled digits"
    if gang.is_chief:
        print(f"data: {source} ({len(labels)} samples)")
    return images.reshape(-1, 1, 8, 8).astype(np.float32), labels.astype(np.int64)


def split_and_standardise(
    images: np.ndarray[Any, Any], labels: np.ndarray[Any, Any]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=SEED
    )
    # Statistics come from the training split only, so the test split stays unseen.
    mean = train_x.mean(axis=0, keepdims=True)
    std = train_x.std(axis=0, keepdims=True)
    std[std == 0] = 1.0  # border pixels are always blank
    return (
        torch.from_numpy((train_x - mean) / std),
        torch.from_numpy(train_y),
        torch.from_numpy((test_x - mean) / std),
        torch.from_numpy(test_y),
    )


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(0.25),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(),
            nn.Linear(128, NUM_CLASSES),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(images))
        return logits


def global_batches(num_samples: int, global_batch: int, epoch: int) -> list[torch.Tensor]:
    """The epoch's global batches of sample indices, identical on every rank.

    Seeding the shuffle by epoch makes a resumed run, at any number of learners, see the
    same batches as an uninterrupted one.
    """
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(SEED + epoch))
    return list(torch.split(order, global_batch))


def sum_over_gang(gang: Gang, values: list[float]) -> list[float]:
    if not gang.distributed:
        return values
    totals = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return [float(value) for value in totals.tolist()]


def exchange_deferred(model: nn.Module, *, defer: bool) -> contextlib.AbstractContextManager[Any]:
    """Gradients of all but a step's last micro-batch stay local; DDP exchanges their sum
    once, after the last one."""
    if defer and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def train_one_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: tuple[torch.Tensor, torch.Tensor],
    global_batch: int,
    epoch: int,
    gang: Gang,
    device: torch.device,
) -> EpochResult:
    images, labels = data
    model.train()
    loss_sum, correct, seen = 0.0, 0, 0
    for batch in global_batches(len(labels), global_batch, epoch):
        # Every rank must take every step (DDP's all-reduce is collective), so a tail too
        # short to give each rank a sample is skipped on all of them alike.
        if len(batch) < gang.world_size:
            continue
        mine = torch.tensor_split(batch, gang.world_size)[gang.rank]
        optimizer.zero_grad()
        micro_batches = torch.split(mine, gang.job.micro_batches(len(mine)))
        for index, micro in enumerate(micro_batches):
            micro_images, micro_labels = images[micro].to(device), labels[micro].to(device)
            last = index == len(micro_batches) - 1
            with exchange_deferred(model, defer=not last):
                logits = model(micro_images)
                loss = nn.functional.cross_entropy(logits, micro_labels)
                # Weighted by its share of the slice: the summed gradients are the slice's mean.
                torch.autograd.backward(loss * len(micro) / len(mine))
            loss_sum += loss.item() * len(micro)
            correct += int((logits.argmax(dim=1) == micro_labels).sum().item())
        optimizer.step()
        seen += len(mine)
    loss_total, correct_total, seen_total = sum_over_gang(gang, [loss_sum, correct, seen])
    return EpochResult(
        loss=loss_total / seen_total, accuracy=correct_total / seen_total, samples=int(seen_total)
    )


@torch.no_grad()
def evaluate(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device
) -> float:
    model.eval()
    predictions = model(images.to(device)).argmax(dim=1)
    return float((predictions == labels.to(device)).float().mean().item())


def gang_agrees_to_stop(gang: Gang) -> bool:
    """True on every rank when any rank was asked to stop, so all leave at the same step."""
    flag = torch.tensor([1.0 if should_stop() else 0.0])
    if gang.distributed:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def checkpoint_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, progress: Progress
) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": progress.completed_epochs,
        "samples": progress.samples,
        "torch_rng": torch.get_rng_state(),
    }


def seed_dropout(gang: Gang, epoch: int, saved_rng: torch.Tensor | None) -> None:
    # Rank 0 continues the saved stream; other ranks need masks that differ from rank 0's
    # and from each other, and reproducible ones, so they derive a seed from where they are.
    if gang.is_chief and saved_rng is not None:
        torch.set_rng_state(saved_rng)
    else:
        torch.manual_seed(SEED + 1000 * epoch + gang.rank)


def write_results(result_dir: Path, model: nn.Module, summary: dict[str, float | int]) -> None:
    result_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), result_dir / "model.pt")
    (result_dir / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")


def resume_from_checkpoint(
    model: nn.Module, optimizer: torch.optim.Optimizer, job: JobContext, device: torch.device
) -> Progress:
    resumed = load_checkpoint(job.checkpoint_dir, map_location=str(device))
    if resumed is None:
        return Progress()
    _, state = resumed
    model.load_state_dict(state["model"])
    # The restored state carries the old batch size's learning rate; the training loop
    # sets the new one before every epoch.
    optimizer.load_state_dict(state["optimizer"])
    epoch = int(state["epoch"])
    return Progress(
        completed_epochs=epoch,
        samples=int(state["samples"]),
        checkpointed_epoch=epoch,
        saved_rng=state.get("torch_rng"),
    )


def finish(
    job: JobContext,
    gang: Gang,
    model: nn.Module,
    test_data: tuple[torch.Tensor, torch.Tensor],
    progress: Progress,
    global_batch: int,
    device: torch.device,
) -> None:
    test_accuracy = evaluate(model, *test_data, device)
    print(f"test accuracy: {test_accuracy:.4f}", flush=True)
    report(step=progress.completed_epochs, group="test", accuracy=test_accuracy)
    write_results(
        job.result_dir,
        model,
        {
            "test_accuracy": test_accuracy,
            "epochs": progress.completed_epochs,
            "final_batch": global_batch,
            "final_learners": gang.world_size,
        },
    )


def main() -> int:
    # Installed before anything slow, so a halt during start-up is not lost.
    install_stop_handler()
    job = context()
    arguments = parse_arguments(job)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(SEED)
    gang = join_gang(job)

    train_x, train_y, test_x, test_y = split_and_standardise(
        *load_images_and_labels(job.data_dir, gang)
    )
    model = DigitsCNN().to(device)
    peak_lr = scaled_learning_rate(arguments.base_lr, arguments.batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=peak_lr)
    progress = resume_from_checkpoint(model, optimizer, job, device)
    seed_dropout(gang, progress.completed_epochs, progress.saved_rng)
    # Wrapped after loading so every rank starts from the checkpoint's weights; DDP also
    # broadcasts rank 0's parameters on construction.
    trained: nn.Module = DistributedDataParallel(model) if gang.distributed else model
    if gang.is_chief:
        print(
            f"config: learners={gang.world_size} batch={arguments.batch_size} "
            f"micro_batch={job.micro_batch_size or '-'} steps={job.accumulation_steps} "
            f"lr={peak_lr:g} resumed_epoch={progress.completed_epochs}",
            flush=True,
        )

    stopped = False
    for epoch in range(progress.completed_epochs + 1, arguments.epochs + 1):
        # Halts are honoured between epochs: an epoch takes well under the grace period,
        # and the checkpoint then holds exactly the last completed epoch.
        if gang_agrees_to_stop(gang):
            stopped = True
            break
        batch, job_now = batch_now(gang, arguments.batch_size)
        if batch != arguments.batch_size:
            arguments.batch_size, gang = batch, replace(gang, job=job_now)
            peak_lr = scaled_learning_rate(arguments.base_lr, batch)
            if gang.is_chief:
                print(
                    f"rebatch: batch={batch} micro_batch={job_now.micro_batch_size or '-'} "
                    f"steps={job_now.accumulation_steps} lr={peak_lr:g} epoch={epoch}",
                    flush=True,
                )
        for group in optimizer.param_groups:
            group["lr"] = epoch_learning_rate(peak_lr, epoch, arguments.epochs)
        result = train_one_epoch(
            trained, optimizer, (train_x, train_y), arguments.batch_size, epoch, gang, device
        )
        progress.completed_epochs, progress.samples = epoch, progress.samples + result.samples
        if gang.is_chief:
            print(
                f"epoch {epoch}/{arguments.epochs} loss {result.loss:.4f} "
                f"accuracy {result.accuracy:.4f}",
                flush=True,
            )
            report(
                step=epoch,
                samples=progress.samples,
                epoch=epoch,
                total_epochs=arguments.epochs,
                loss=result.loss,
                accuracy=result.accuracy,
            )
            save_checkpoint(checkpoint_state(model, optimizer, progress), epoch)
            progress.checkpointed_epoch = epoch

    if stopped and gang.is_chief:
        if progress.checkpointed_epoch != progress.completed_epochs:
            save_checkpoint(checkpoint_state(model, optimizer, progress), progress.completed_epochs)
        print(f"halt requested: checkpoint saved at epoch {progress.completed_epochs}", flush=True)
    leave_gang(gang)
    if gang.is_chief and not stopped:
        finish(job, gang, model, (test_x, test_y), progress, arguments.batch_size, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
