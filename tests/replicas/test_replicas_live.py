"""Real ``ffdl up`` replicas sharing one PostgreSQL database and home: one runs each loop,
the loops spread over the replicas, another takes over when one dies or freezes, and no job
is lost, duplicated or started twice."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.server.leases import LOOPS
from tests.integration import views
from tests.integration.live import FAST_CONFIG, LiveServer, serving_replicas, wait_for
from tests.integration.steps_job import steps_job
from tests.integration.test_cli import ffdl
from tests.postgres import PostgresServer

REPLICA_CONFIG = {**FAST_CONFIG, "lease_ttl_s": 1.5}


@pytest.fixture
def replicas(tmp_path: Path, postgres: PostgresServer) -> Iterator[list[LiveServer]]:
    config = {**REPLICA_CONFIG, "database_url": postgres.create_database()}
    with serving_replicas(tmp_path / "home", config, 3) as started:
        yield started


def control_plane(replica: LiveServer) -> dict[str, Any]:
    response = replica.client.get("/v1/replicas")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def leader(replica: LiveServer, loop: str) -> str | None:
    lease = next(x for x in control_plane(replica)["leases"] if x["name"] == loop)
    return lease["holder"]


def replica_named(replicas: list[LiveServer], asking: LiveServer, name: str) -> LiveServer:
    pids = {r["id"]: r["pid"] for r in control_plane(asking)["replicas"]}
    return next(r for r in replicas if r.proc is not None and r.proc.pid == pids[name])


def starts(replica: LiveServer, job_id: str) -> list[str]:
    return [
        line for line in views.lines(replica, job_id) if re.match(r"learner \d+/\d+ start=", line)
    ]


def wait_until_spread(asking: LiveServer) -> None:
    def spread() -> bool:
        alive = [r for r in control_plane(asking)["replicas"] if r["alive"]]
        return [len(r["leads"]) for r in alive] == [2, 2, 2]

    wait_for(spread, timeout=30, interval=0.2, what="the loops spread two to each replica")


def test_every_replica_serves_one_leads_each_loop_and_a_rolling_restart_loses_nothing(
    replicas: list[LiveServer],
) -> None:
    # The first replica up takes every loop, then hands them over until each leads its share.
    wait_until_spread(replicas[2])
    view = control_plane(replicas[2])
    alive = [r for r in view["replicas"] if r["alive"]]
    assert len(alive) == 3
    holders = {lease["name"]: lease["holder"] for lease in view["leases"]}
    assert set(holders) == set(LOOPS)
    assert set(holders.values()) <= {r["id"] for r in alive}
    assert sum(len(r["leads"]) for r in alive) == len(LOOPS), "each loop has one leader"
    # A job submitted to one replica is run and followed whichever replica serves it,
    # while every replica is stopped and started again in turn (an upgrade, say).
    manifest, files = steps_job(30, pause=0.1)
    job_id = replicas[1].submit_ok(manifest, files)
    replicas[2].wait_status(job_id, {"PROCESSING"}, timeout=60)
    for replica in replicas:
        replica.stop()
        replica.start()
    model = replicas[0].wait_status(job_id, {"COMPLETED"}, timeout=90)
    assert model["training"]["training_status"]["status"] == "COMPLETED"
    assert views.steps(views.lines(replicas[2], job_id)) == list(range(1, 31))
    assert len(starts(replicas[1], job_id)) == 1, "never restarted, never started twice"
    after = control_plane(replicas[0])
    assert sum(1 for r in after["replicas"] if r["alive"]) == 3
    assert sum(1 for r in after["replicas"] if not r["alive"]) == 3, "the stopped ones"
    # What an operator reads: every replica, up or gone, and who runs each loop (once the
    # restarted replicas have their shares again, so that no lease is between holders).
    wait_until_spread(replicas[2])
    shown = ffdl(replicas[2], "--url", replicas[2].url, "status")
    assert shown.returncode == 0, shown.stderr
    rows = shown.stdout.splitlines()
    assert sum(" up " in row for row in rows) == 3 and sum(" gone " in row for row in rows) == 3
    leaders = {lease["name"]: lease["holder"] for lease in control_plane(replicas[2])["leases"]}
    for loop, holder in leaders.items():
        assert any(loop in row and holder in row for row in rows), (loop, shown.stdout)


def test_killing_the_leader_hands_the_loops_over_and_loses_nothing(
    replicas: list[LiveServer],
) -> None:
    manifest, files = steps_job(40, pause=0.1, memory="1GiB")
    jobs = [replicas[i % 3].submit_ok(manifest, files) for i in range(6)]
    for kill in range(2):
        survivors = [r for r in replicas if r.proc is not None]
        asking = survivors[-1]
        # A lease is briefly held by no one while the loops spread out over the replicas.
        old = wait_for(
            lambda asking=asking: leader(asking, "lcm"),
            timeout=15,
            interval=0.1,
            what=f"an lcm leader (kill {kill + 1})",
        )
        victim = replica_named(replicas, asking, old)
        victim.stop(signal.SIGKILL)
        survivors = [r for r in replicas if r.proc is not None]

        def new_leader(asking: LiveServer = survivors[0], old: str = old) -> str | None:
            holder = leader(asking, "lcm")
            return holder if holder not in (None, old) else None

        wait_for(new_leader, timeout=15, interval=0.1, what=f"a new lcm leader (kill {kill + 1})")
    (last,) = [r for r in replicas if r.proc is not None]
    for job_id in jobs:
        last.wait_status(job_id, {"COMPLETED"}, timeout=120)
        printed = views.lines(last, job_id)
        assert views.steps(printed) == list(range(1, 41)), job_id
        assert len(starts(last, job_id)) == 1, ("started once", starts(last, job_id))
    listed = last.client.get("/v1/models").json()["models"]
    assert sorted(m["model_id"] for m in listed) == sorted(jobs), "none lost or duplicated"


def test_a_frozen_leader_loses_its_leases_and_returns_without_its_old_tokens(
    replicas: list[LiveServer],
) -> None:
    asking = replicas[2]
    old = leader(asking, "scheduler")
    assert old is not None
    frozen = replica_named(replicas, asking, old)
    assert frozen.proc is not None
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        other = next(r for r in replicas if r is not frozen)
        wait_for(
            lambda: all(leader(other, loop) not in (None, old) for loop in LOOPS),
            timeout=30,
            interval=0.1,
            what="every loop taken from the frozen replica",
        )
        manifest, files = steps_job(5, pause=0.05)
        job_id = other.submit_ok(manifest, files)
        other.wait_status(job_id, {"COMPLETED"}, timeout=60)
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    # Back from its pause, the old leader serves requests but holds none of its old leases:
    # its clock says they ran out. It may be given a share again, each lease with a new token.
    tokens = {x["name"]: x["token"] for x in control_plane(other)["leases"]}
    wait_for(lambda: frozen.client.get("/health").status_code == 200, timeout=15)
    for lease in control_plane(frozen)["leases"]:
        if lease["holder"] == old:
            assert lease["token"] > tokens[lease["name"]], lease
    assert starts(other, job_id) and len(starts(other, job_id)) == 1
