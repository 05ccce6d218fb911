"""FfDL-style TensorFlow example code, as its users wrote it: flags naming files under
$DATA_DIR, GPU_COUNT read the FfDL way, TensorBoard summaries under $LOG_DIR/tb, the trained
model written into $RESULT_DIR. The "training" is a small computation over the real bytes
of the data files, so the results prove which data the job read."""

import argparse
import gzip
import json
import os
import socket
import struct

from torch.utils.tensorboard import SummaryWriter

parser = argparse.ArgumentParser()
for flag in ("trainImagesFile", "trainLabelsFile", "testImagesFile", "testLabelsFile"):
    parser.add_argument(f"--{flag}", required=True)
parser.add_argument("--learningRate", type=float, default=0.01)
parser.add_argument("--trainingIters", type=int, default=10)
args = parser.parse_args()

gpus = int(float(os.environ["GPU_COUNT"]))
print(f"GPU_COUNT={os.environ['GPU_COUNT']} -> {gpus} gpus", flush=True)


def idx(path: str) -> tuple[int, list[int]]:
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    magic, count = struct.unpack(">II", raw[:8])
    return magic, list(raw[8 + (8 if magic == 2051 else 0) :])[: count * 16]


magic, pixels = idx(args.trainImagesFile)
label_magic, labels = idx(args.trainLabelsFile)
assert (magic, label_magic) == (2051, 2049), (magic, label_magic)
mean = sum(pixels) / len(pixels)
print(f"train images: {len(pixels)} pixels, mean {mean:.2f}; labels {labels}", flush=True)

board = os.path.join(os.environ["LOG_DIR"], "tb")
train = SummaryWriter(os.path.join(board, "train"))
test = SummaryWriter(os.path.join(board, "test"))
for step in range(1, args.trainingIters + 1):
    train.add_scalar("loss", mean / (step * 100), step)
    train.add_scalar("accuracy", step / args.trainingIters, step)
    print(f"Iter {step}, Minibatch Loss= {mean / (step * 100):.6f}", flush=True)
    if step % 2 == 0:
        test.add_scalar("accuracy", step / (2 * args.trainingIters), step)
train.close()
test.close()

result = os.environ["RESULT_DIR"]
os.makedirs(os.path.join(result, "model"), exist_ok=True)
with open(os.path.join(result, "model", "weights.json"), "w") as handle:
    json.dump({"mean_pixel": mean, "labels": labels, "lr": args.learningRate}, handle)
with open(os.path.join(result, "environment.json"), "w") as handle:
    seen = {
        key: os.environ.get(key)
        for key in (
            "GPU_COUNT",
            "LEARNER_NAME_PREFIX",
            "TRAINING_COMMAND",
            "RESULT_BUCKET_DIR",
            "LOG_DIR",
            "JOB_STATE_DIR",
            "TRAINING_ID",
            "DATA_DIR",
        )
    }
    seen["hostname"] = socket.gethostname()
    seen["results_under_bucket"] = os.path.samefile(
        os.path.join(os.environ["RESULT_BUCKET_DIR"], os.environ["TRAINING_ID"]), result
    )
    json.dump(seen, handle)
print("Optimization Finished!", flush=True)
