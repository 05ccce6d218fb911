"""A job's stdout and stderr lines reach its log in the order the job wrote them, through a
real server and controller, and a failed job's reason ends on its error (the last stderr
lines), not on whatever stdout printed last."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, ffdl_output, manifest_yaml, serving

PAIRS = 30
# Each pair: a line on stdout, then at once one on stderr; the next pair a little later.
INTERLEAVED = f"""
import sys, time
for i in range({PAIRS}):
    print(f"out {{i}}", flush=True)
    print(f"err {{i}}", file=sys.stderr, flush=True)
    time.sleep(0.05)
print("starting", flush=True)
print(1 / 0)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("output-order") / "home"
    with serving(LiveServer(home=home, config=dict(FAST_CONFIG))) as live:
        yield live


def test_lines_keep_the_order_the_job_wrote_them_across_stdout_and_stderr(
    server: LiveServer,
) -> None:
    job_id = server.submit_ok(manifest_yaml("python job.py", gpus=0), {"job.py": INTERLEAVED})
    model = server.wait_status(job_id, {"FAILED"}, timeout=90)
    lines = [str(item["line"]) for item in server.loglines(job_id)]
    user = [line for line in lines if not line.startswith("[ffdl]")]
    expected = [line for i in range(PAIRS) for line in (f"out {i}", f"err {i}")]
    assert user[: 2 * PAIRS + 2] == [*expected, "starting", "Traceback (most recent call last):"]
    assert user[-1] == "ZeroDivisionError: division by zero"
    # The reason ends on the error, not on "starting".
    reason = model["training"]["training_status"]["status_message"]
    assert reason.endswith("ZeroDivisionError: division by zero"), reason
    # ffdl logs shows them in the same order.
    shown = [
        line
        for line in ffdl_output(server, "logs", job_id, columns=200).splitlines()
        if line.startswith(("out ", "err ", "starting", "Traceback"))
    ]
    assert shown == [*expected, "starting", "Traceback (most recent call last):"]


def test_a_failed_jobs_reason_ends_on_its_last_stderr_lines(server: LiveServer) -> None:
    code = (
        "import sys\n"
        "print('error: no data in DATA_DIR', file=sys.stderr, flush=True)\n"
        "print('cleaning up', flush=True)\n"
        "sys.exit(3)\n"
    )
    job_id = server.submit_ok(manifest_yaml("python job.py", gpus=0), {"job.py": code})
    model = server.wait_status(job_id, {"FAILED"}, timeout=90)
    reason = model["training"]["training_status"]["status_message"]
    assert reason == "learner 1 exited with code 3; last lines: error: no data in DATA_DIR"
