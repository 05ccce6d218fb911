"""Screenshots of the dashboard's main views, taken from a real server in headless Chromium.

Starts a server on 127.0.0.1 whose node has 4 GPUs read through the stand-in NVML library
(the same one the tests use), runs a short job with another queued behind it, then a job
that reports its loss and accuracy with a declared total, queues a second one behind it,
and saves ``job.png`` (a job's charts) and ``cluster.png`` (the cluster over time, the
queue and a past ETA against its real start) beside this file.

    python docs/screenshots/make_screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from tests.gpu_sampling.standin import Gpu, build, set_figures  # noqa: E402
from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for  # noqa: E402

TRAIN = """
import math, time
from ffdl.sdk.api import report
for step in range(1, 301):
    loss = 2.3 * math.exp(-step / 60) + 0.05 * math.sin(step / 5) ** 2
    report(step, samples=step * 256, total_steps=600, loss=loss, accuracy=1 - loss / 2.4)
    if step % 25 == 0:
        report(step, group="validation", loss=loss * 1.1, accuracy=1 - loss / 2.2)
    time.sleep(0.08)
time.sleep(120)
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        library = build(Path(tmp) / "nvml")
        set_figures(library, [Gpu(83, 31000), Gpu(78, 29500), Gpu(0, 0), Gpu(0, 0)])
        config = {
            **FAST_CONFIG,
            "nvml_library": str(library),
            "gpu_sample_s": 0.5,
            "cluster_sample_s": 1.0,
            "nodes": [{**FAST_CONFIG["nodes"][0], "gpu_type": "H100"}],
        }
        server = LiveServer(home=Path(tmp) / "home", config=config)
        with serving(server):
            # A short job holding every GPU and one waiting for it: once it has started, the
            # queue panel shows how far its first ETA was from its real start.
            server.submit_ok(
                manifest_yaml(
                    "python -c 'import time; time.sleep(4)'",
                    name="warm-up",
                    gpus=4,
                    expected_duration="10s",
                )
            )
            waited = server.submit_ok(
                manifest_yaml("python -c pass", name="waited-its-turn", gpus=4)
            )
            server.wait_status(waited, {"COMPLETED"}, timeout=60)
            job = server.submit_ok(
                manifest_yaml("python train.py", name="resnet-digits", gpus=2),
                {"train.py": TRAIN},
            )
            server.submit_ok(manifest_yaml("python -c pass", name="waits-for-gpus", gpus=4))
            time.sleep(25)  # a run of points, GPU samples and cluster history to draw
            options = Options()
            options.binary_location = "/usr/bin/chromium"
            for flag in (
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1400,2600",
            ):
                options.add_argument(flag)
            driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
            try:
                driver.get(f"{server.url}/#token={server.token}")
                wait_for(
                    lambda: driver.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-id="{job}"]'),
                    timeout=30,
                    what="the job's row",
                )
                driver.find_element(By.CSS_SELECTOR, f'#jobs tr[data-id="{job}"]').click()
                wait_for(
                    lambda: driver.find_elements(By.CSS_SELECTOR, "#gpu-chart canvas"),
                    timeout=30,
                    what="the charts",
                )
                time.sleep(12)  # the cluster charts refresh every 10 s
                driver.save_screenshot(str(HERE / "job.png"))
                driver.execute_script("document.querySelector('#cluster-gpus').scrollIntoView()")
                driver.save_screenshot(str(HERE / "cluster.png"))
            finally:
                driver.quit()
    print(f"saved {HERE / 'job.png'} and {HERE / 'cluster.png'}")


if __name__ == "__main__":
    main()
