"""Train a small PyTorch CNN on the 8x8 digits data set, the ffdl way.

Shows the whole training-code contract of the platform: read the job context, resume from
the newest checkpoint, report per-epoch metrics, checkpoint every epoch, stop cleanly when
the platform asks for a halt, and write the trained model and final metrics to RESULT_DIR.

Data: ``$DATA_DIR/digits.npz`` (arrays ``images`` and ``target``) when staged, else
scikit-learn's bundled copy (no download).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

# Must precede the imports that load an OpenMP runtime. With the default busy-waiting, two
# threads on CPUs shared with other processes (other learners) spin instead of working:
# training here ran up to ten times slower on a busy two-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

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


def available_cpus() -> int:
    # The CPUs this process may run on, which a container or the platform may restrict.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parse_arguments(job: JobContext) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    # The platform sets FFDL_BATCH_SIZE when an elastic rescale changes the batch size.
    parser.add_argument("--batch-size", type=int, default=job.batch_size or 64)
    parser.add_argument("--lr", type=float, default=2e-3)
    return parser.parse_args()


def load_images_and_labels(data_dir: Path) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    staged = data_dir / STAGED_DATA_FILE
    if staged.is_file():
        with np.load(staged) as arrays:
            images, labels = arrays["images"], arrays["target"]
        print(f"data: {staged} ({len(labels)} samples)")
    else:
        bundled = load_digits()
        images, labels = bundled.images, bundled.target
        print(f"data: scikit-learn bundled digits ({len(labels)} samples)")
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


def train_one_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    epoch: int,
    device: torch.device,
) -> tuple[float, float]:
    model.train()
    # Seeding the shuffle by epoch makes a resumed run see the same batches as an
    # uninterrupted one.
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SEED + epoch))
    loss_sum, correct = 0.0, 0
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        batch_images, batch_labels = images[batch].to(device), labels[batch].to(device)
        optimizer.zero_grad()
        logits = model(batch_images)
        loss = nn.functional.cross_entropy(logits, batch_labels)
        torch.autograd.backward(loss)
        optimizer.step()
        loss_sum += loss.item() * len(batch)
        correct += int((logits.argmax(dim=1) == batch_labels).sum().item())
    return loss_sum / len(labels), correct / len(labels)


@torch.no_grad()
def evaluate(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device
) -> float:
    model.eval()
    predictions = model(images.to(device)).argmax(dim=1)
    return float((predictions == labels.to(device)).float().mean().item())


def checkpoint_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int
) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}


def main() -> int:
    # Installed before anything slow, so a halt during start-up is not lost.
    install_stop_handler()
    job = context()
    arguments = parse_arguments(job)
    torch.manual_seed(SEED)
    torch.set_num_threads(min(2, available_cpus()))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"training on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")

    train_x, train_y, test_x, test_y = split_and_standardise(*load_images_and_labels(job.data_dir))
    model = DigitsCNN().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=arguments.lr)

    completed_epochs = 0
    checkpointed_epoch: int | None = None
    resumed = load_checkpoint(job.checkpoint_dir, map_location=str(device))
    if resumed is not None:
        _, state = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        completed_epochs = checkpointed_epoch = int(state["epoch"])
        print(f"resumed from epoch {completed_epochs}")

    for epoch in range(completed_epochs + 1, arguments.epochs + 1):
        # Halts are honoured between epochs: an epoch here takes about a second at most,
        # far below the platform's grace period, and the checkpoint is then exact.
        if should_stop():
            break
        loss, accuracy = train_one_epoch(
            model, optimizer, train_x, train_y, arguments.batch_size, epoch, device
        )
        print(f"epoch {epoch}/{arguments.epochs} loss {loss:.4f} accuracy {accuracy:.4f}")
        # The total lets the platform show the job's progress and time left.
        report(
            step=epoch,
            epoch=epoch,
            total_epochs=arguments.epochs,
            group="train",
            loss=loss,
            accuracy=accuracy,
        )
        save_checkpoint(checkpoint_state(model, optimizer, epoch), epoch)
        completed_epochs = checkpointed_epoch = epoch

    if should_stop():
        if checkpointed_epoch != completed_epochs:
            save_checkpoint(checkpoint_state(model, optimizer, completed_epochs), completed_epochs)
        print(f"halt requested: checkpoint saved at epoch {completed_epochs}")
        return 0

    test_accuracy = evaluate(model, test_x, test_y, device)
    print(f"test accuracy: {test_accuracy:.4f}")
    report(step=completed_epochs, group="test", accuracy=test_accuracy)
    job.result_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), job.result_dir / "model.pt")
    summary = {"test_accuracy": test_accuracy, "epochs": completed_epochs}
    (job.result_dir / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
