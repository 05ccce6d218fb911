"""A real ``ffdl up --workers`` pool on 127.0.0.1: it grows under a load burst and shrinks
after it without one failed request, says why each time, and a retiring worker still
answers a request a client sends on an idle keep-alive connection."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ffdl.cli.main import app as cli
from ffdl.server.main import serve
from tests.integration.live import FAST_CONFIG, pid_alive, serving, wait_for
from tests.pool.load import LoadGenerator, PoolServer

# Quick to act, so that the test sees growth and shrinkage within seconds.
POOL_CONFIG: dict[str, Any] = {
    **FAST_CONFIG,
    "pool_window_s": 2.0,
    "pool_grow_after_s": 1.0,
    "pool_shrink_after_s": 2.0,
    "pool_cooldown_s": 1.0,
}


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[PoolServer]:
    with serving(PoolServer(home=tmp_path / "home", config=dict(POOL_CONFIG))) as server:
        yield server


def sizes(view: dict[str, Any]) -> tuple[int, int]:
    """The pool's target size and how many of its workers serve."""
    return view["size"], sum(1 for w in view["workers"] if w["state"] == "serving")


def test_the_pool_grows_under_a_burst_and_shrinks_after_without_a_failed_request(
    pool: PoolServer,
) -> None:
    view = pool.pool()
    assert view["enabled"] and (view["min"], view["max"]) == (1, 3)
    wait_for(lambda: sizes(pool.pool()) == (1, 1), timeout=20, what="one serving worker")
    load = LoadGenerator(pool.url, pool.token).start()
    try:
        load.set(24)  # a burst: 24 clients back to back
        wait_for(lambda: sizes(pool.pool()) == (3, 3), timeout=25, what="the pool at MAX")

        def spread() -> bool:
            # The busy clients' keep-alive connections end after pool_connection_max_s, and
            # they reconnect to the new workers too.
            served = [w["requests"] for w in pool.pool()["workers"] if w["state"] == "serving"]
            return len(served) == 3 and min(served) >= 50

        wait_for(spread, timeout=15, what="the burst spread over the three workers")
        load.set(1, think_s=0.02)  # then one light client, which keeps going as it shrinks
        wait_for(lambda: sizes(pool.pool()) == (1, 1), timeout=25, what="the pool back at MIN")
        wait_for(lambda: len(pool.pool()["workers"]) == 1, timeout=15, what="the retired gone")
    finally:
        outcomes = load.stop()
    assert len(outcomes) > 200
    assert load.failures == [], f"{len(load.failures)} failed: {load.failures[:5]}"

    changes = pool.pool()["changes"]
    assert [(c["from"], c["to"]) for c in changes] == [(1, 2), (2, 3), (3, 2), (2, 1)]
    reasons = [c["reason"] for c in changes]
    grow = r"in-flight [\d.]+/worker > 4.* for \d+ s$"
    assert re.match(r"^grow 1→2: " + grow, reasons[0]), reasons
    assert re.match(r"^grow 2→3: " + grow, reasons[1]), reasons
    assert re.match(r"^shrink 3→2: load fits 2 for \d+ s \(in-flight [\d.]+/worker < 1", reasons[2])
    assert re.match(r"^shrink 2→1: load fits 1 for \d+ s \(in-flight [\d.]+/worker < 1", reasons[3])
    # Each change is in the server's log too, with the same reason.
    log = (pool.home / pool.log_name).read_text()
    assert all(f"API pool: {reason}" in log for reason in reasons)


def connection_to(pool: PoolServer, pid: int) -> http.client.HTTPConnection:
    """A keep-alive connection that worker ``pid`` accepted (the kernel hands each new
    connection to any worker; open some until one lands on it)."""
    opened = []
    for _ in range(40):
        conn = http.client.HTTPConnection("127.0.0.1", pool.port, timeout=10)
        if answered_by(pool, conn)[0] == pid:
            for other in opened:
                other.close()
            return conn
        opened.append(conn)
    raise AssertionError(f"no connection reached worker {pid}")


def answered_by(pool: PoolServer, conn: http.client.HTTPConnection) -> tuple[int, str | None]:
    conn.request("GET", "/v1/cluster/pool", headers={"Authorization": f"Bearer {pool.token}"})
    response = conn.getresponse()
    body = json.loads(response.read())
    assert response.status == 200, body
    return int(body["answered_by"]), response.getheader("connection")


def test_a_retiring_worker_answers_on_an_idle_keep_alive_connection(tmp_path: Path) -> None:
    config = {**POOL_CONFIG, "pool_keepalive_s": 20}
    server = PoolServer(home=tmp_path / "home", config=config, workers="2")
    with serving(server) as pool:
        wait_for(lambda: sizes(pool.pool()) == (2, 2), timeout=20, what="two serving workers")
        oldest = pool.pool()["workers"][0]["pid"]
        idle = connection_to(pool, oldest)
        # gunicorn's own way to take one worker away: the arbiter retires the oldest.
        assert pool.proc is not None
        os.kill(pool.proc.pid, signal.SIGTTOU)

        def draining() -> bool:
            states = {w["pid"]: w["state"] for w in pool.pool()["workers"]}
            return states.get(oldest) == "draining"

        wait_for(draining, timeout=10, what=f"worker {oldest} draining")
        # Stock uvicorn would have closed this idle connection at once; a request the client
        # sent on it meanwhile would fail. It is answered, and told to go elsewhere next.
        assert answered_by(pool, idle) == (oldest, "close")
        idle.close()
        wait_for(lambda: not pid_alive(oldest), timeout=15, what=f"worker {oldest} to exit")
        # The pool's bounds (2..2) bring it back to two.
        wait_for(lambda: sizes(pool.pool()) == (2, 2), timeout=20, what="two workers again")
        reasons = [c["reason"] for c in pool.pool()["changes"]]
        assert reasons == ["grow 1→2: outside 2..2"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("3..1", "MIN 3 is greater than MAX 1"),
        ("0..2", "MIN must be at least 1"),
        ("x", "MIN..MAX"),
    ],
)
def test_a_bad_workers_option_is_refused_before_anything_starts(
    tmp_path: Path, value: str, problem: str
) -> None:
    result = CliRunner().invoke(cli, ["up", "--home", str(tmp_path), "--workers", value])
    assert result.exit_code == 2
    assert "--workers" in result.output and problem in " ".join(result.output.split())
    assert not (tmp_path / "ffdl.db").exists()


def test_a_bad_workers_setting_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"workers": "4..2"}))
    with pytest.raises(SystemExit, match=re.escape("ffdl: workers: MIN 4 is greater than MAX 2")):
        serve(home=tmp_path)
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"workers": "1..2", "pool_grow_in_flight": 2, "pool_shrink_in_flight": 3})
    )
    with pytest.raises(
        SystemExit, match=re.escape("pool_shrink_in_flight (3) must be below pool_grow")
    ):
        serve(home=tmp_path)
    assert not (tmp_path / "ffdl.db").exists()
