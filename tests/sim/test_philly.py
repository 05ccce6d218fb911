"""The Philly trace loader: filters (window, virtual cluster, sampling) and the job rules."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from ffdl.core.resources import Node
from ffdl.sim.engine import Simulator
from ffdl.sim.philly import (
    TraceError,
    TraceFilter,
    default_trace_path,
    family_of,
    load_philly,
    parse_time,
    read_rows,
    select,
)
from ffdl.sim.policies import make_policy

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
ROWS = [
    ("2017-10-01 00:00:00", 100.0, 1, "vc-a"),
    ("2017-10-01 01:00:00", 200.0, 2, "vc-b"),
    ("2017-10-02 00:00:00", 300.0, 8, "vc-a"),
    ("2017-10-03 12:00:00", 400.0, 4, "vc-b"),
    ("2017-10-05 00:00:00", 0.0, 1, "vc-a"),
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    lines = [f"{t},{d},{g},{d * g},{vc}\n" for t, d, g, vc in ROWS]
    path.write_text(HEADER + "".join(lines))
    return path


def test_all_rows_become_jobs_in_arrival_order_from_time_zero(trace: Path) -> None:
    jobs = load_philly(trace, gpus_per_node=8)
    assert [j.submit_s for j in jobs] == [0.0, 3600.0, 86400.0, 216000.0, 345600.0]
    assert [j.gpus for j in jobs] == [1, 2, 8, 4, 1]
    assert all(j.per_learner.gpus == 1 and j.learners == j.gpus for j in jobs)
    assert [j.expected_duration_s for j in jobs] == [100.0, 200.0, 300.0, 400.0, 1.0]
    assert [j.elastic_gpus for j in jobs] == [(1, 2), (1, 4), (1, 16), (1, 8), (1, 2)]
    assert [j.tenant for j in jobs] == ["vc-a", "vc-b", "vc-a", "vc-b", "vc-a"]


def test_window_filter_keeps_start_inclusive_end_exclusive(trace: Path) -> None:
    where = TraceFilter(start=parse_time("2017-10-01T01:00"), end=parse_time("2017-10-03 12:00:00"))
    jobs = load_philly(trace, where)
    assert [j.gpus for j in jobs] == [2, 8]
    assert jobs[0].submit_s == 0.0


def test_virtual_cluster_filter(trace: Path) -> None:
    assert [j.gpus for j in load_philly(trace, TraceFilter(vc="vc-b"))] == [2, 4]
    assert load_philly(trace, TraceFilter(vc="nobody")) == []


def test_sampling_is_deterministic_nested_and_about_the_rate() -> None:
    rows = list(read_rows(default_trace_path()))
    assert len(rows) == 82_247
    tenth = select(iter(rows), TraceFilter(sample=0.1))
    again = select(iter(rows), TraceFilter(sample=0.1))
    fifth = select(iter(rows), TraceFilter(sample=0.2))
    other_seed = select(iter(rows), TraceFilter(sample=0.1, seed=2))
    assert [r.index for r in tenth] == [r.index for r in again]
    assert {r.index for r in tenth} <= {r.index for r in fifth}
    assert {r.index for r in tenth} != {r.index for r in other_seed}
    assert abs(len(tenth) / len(rows) - 0.1) < 0.01
    assert abs(len(fifth) / len(rows) - 0.2) < 0.01


def test_families_come_from_the_row_and_fifo_reproduces_trace_durations(trace: Path) -> None:
    rows = list(read_rows(trace))
    assert [family_of(r) for r in rows] == [family_of(r) for r in read_rows(trace)]
    jobs = load_philly(trace, gpus_per_node=8)
    nodes = [Node(f"n{i}", 8, 64.0, 524288) for i in range(2)]
    result = Simulator(nodes, jobs, make_policy("fifo")).run()
    runs = [
        o.finish_s - o.first_start_s
        for o in result.outcomes
        if o.finish_s is not None and o.first_start_s is not None
    ]
    assert runs == pytest.approx([d for _t, d, _g, _vc in ROWS])


def test_bad_inputs_are_reported(tmp_path: Path) -> None:
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="expected header"):
        load_philly(bad_header)
    bad_row = tmp_path / "row.csv"
    bad_row.write_text(HEADER + "yesterday,1,1,1,vc\n")
    with pytest.raises(TraceError, match="bad row 2"):
        load_philly(bad_row)
    with pytest.raises(TraceError, match="cannot read"):
        load_philly(tmp_path / "missing.csv")
    with pytest.raises(TraceError):
        TraceFilter(sample=0.0)
    with pytest.raises(TraceError):
        TraceFilter(start=datetime(2017, 10, 2), end=datetime(2017, 10, 1))
    with pytest.raises(TraceError):
        parse_time("soon")
