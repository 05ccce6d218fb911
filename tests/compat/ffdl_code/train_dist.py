"""FfDL-style distributed PyTorch code: each learner joins a gloo process group at the
first learner's host name (built from LEARNER_NAME_PREFIX, as FfDL's examples did), reads
its shard of $DATA_DIR, averages a "gradient" with its peer every epoch, and prints progress
lines that the manifest's regex_extractor turns into metrics. Learner 1 saves the model."""

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--data_dir", required=True)
args = parser.parse_args()

rank = int(os.environ["LEARNER_ID"]) - 1
world = int(os.environ["NUM_LEARNERS"])
prefix = os.environ["LEARNER_NAME_PREFIX"]
gpus = int(float(os.environ["GPU_COUNT"]))
assert socket.gethostname() == f"{prefix}-{rank}", socket.gethostname()

master = f"{prefix}-0.{prefix}"
dist.init_process_group(
    "gloo",
    init_method=f"tcp://{master}:{os.environ['MASTER_PORT']}",
    rank=rank,
    world_size=world,
)
with open(os.path.join(args.data_dir, "shards", f"shard-{rank}.txt")) as handle:
    values = [float(word) for word in handle.read().split()]
weight = torch.zeros(1)
for epoch in range(1, args.epochs + 1):
    gradient = torch.tensor([sum(values) / len(values) - weight.item()])
    dist.all_reduce(gradient)
    weight += 0.5 * gradient / world
    loss = abs(gradient.item()) / world
    print(
        f"Epoch {epoch} rank {rank} loss={loss:.4f} accuracy={epoch / args.epochs:.4f} gpus={gpus}",
        flush=True,
    )
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    with open(os.path.join(os.environ["RESULT_DIR"], "model.json"), "w") as handle:
        json.dump({"weight": weight.item(), "learners": world}, handle)
print(f"learner {rank + 1} of {world} done on {socket.gethostname()}", flush=True)
