"""A training job for tests of where and how jobs run: it counts steps, checkpoints after
each (with every step done so far), honours halts, and leaves ``model.json`` with the steps
it did, so that "every step exactly once" can be read off its log and off its model.

Learner 1 prints ``step N`` and reports it; every learner prints
``learner I/N start=S gpus=CUDA_VISIBLE_DEVICES`` when it starts.
"""

from __future__ import annotations

from typing import Any

from tests.integration.live import manifest_yaml

STEPS = """
import json, os, sys, time
from ffdl.sdk.api import context, load_checkpoint, report, save_checkpoint, should_stop

ctx = context()
restored = load_checkpoint()
step, done = (0, []) if restored is None else (restored[1]["step"], restored[1]["done"])
print(f"learner {ctx.learner_id}/{ctx.num_learners} start={step} "
      f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
while step < TOTAL:
    step += 1
    done.append(step)
    time.sleep(PAUSE)
    if ctx.learner_id == 1:
        print(f"step {step}", flush=True)
        report(step=step, samples=step * 64)
        save_checkpoint({"step": step, "done": done}, step, keep=2)
    if should_stop():
        sys.exit(0)
if ctx.learner_id == 1:
    with open(os.path.join(os.environ["RESULT_DIR"], "model.json"), "w") as out:
        json.dump({"steps": step, "done": done}, out)
print(f"learner {ctx.learner_id} finished at {step}", flush=True)
"""


def steps_job(total: int, pause: float = 0.1, **fields: Any) -> tuple[str, dict[str, str]]:
    """A manifest (``fields`` added to it) and the code of a job of ``total`` steps."""
    code = STEPS.replace("TOTAL", str(total)).replace("PAUSE", str(pause))
    return manifest_yaml("python steps.py", **fields), {"steps.py": code}
