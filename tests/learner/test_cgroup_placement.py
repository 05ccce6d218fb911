"""Where learners' cgroups go, discovered on fabricated cgroup trees: cgroup v2 nested
without delegation, under a delegating ancestor, delegated by systemd, under a configured
``cgroup_parent`` (and every way one can be wrong), cgroup v1, and no cgroups at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from ffdl.learner.cgroup_placement import NONE, V1, V2, CgroupParentError, discover
from ffdl.learner.cgroups import LearnerCgroup
from tests.learner.cgroupfs import FabricatedCgroupFs, v1_tree, v2_tree

ALL = "cpu io memory pids"


def _service_host(tmp: Path, root_enables: str = ALL) -> FabricatedCgroupFs:
    """A host as systemd lays it out: the platform in /system.slice/ffdl.service, whose
    slice gives it memory but which enables nothing for its own children."""
    return v2_tree(
        tmp,
        {
            "": (ALL, root_enables, "1\n"),
            "system.slice": (ALL, ALL, ""),
            "system.slice/ffdl.service": (ALL, "", "4242\n"),
        },
        own="/system.slice/ffdl.service",
    )


def test_nested_v2_uses_an_ffdl_subtree_of_the_nearest_ancestor_that_delegates_memory(
    tmp_path: Path,
) -> None:
    fs = _service_host(tmp_path)
    placement = discover(fs=fs)
    subtree = fs.root / "system.slice" / "ffdl"
    assert placement.version == V2 and placement.origin == "ancestor"
    assert placement.directories == (subtree,)
    assert placement.cpu
    # The subtree holds no processes, so it enables memory and cpu for the learners.
    assert fs.enabled(subtree) == {"cpu", "memory"}
    # The platform's own cgroup, which holds processes, was never asked to enable anything.
    assert not any(path == fs.root / "system.slice/ffdl.service" for path, _ in fs.writes)
    assert placement.learner_directories("l1") == [subtree / "l1"]
    assert "system.slice/ffdl" in placement.describe()


def test_nested_v2_without_any_writable_ancestor_that_delegates_memory_gets_no_cgroup(
    tmp_path: Path,
) -> None:
    fs = v2_tree(
        tmp_path,
        {
            "": (ALL, "cpu pids", "1\n"),
            "box": ("cpu pids", "", "4242\n"),
        },
        own="/box",
    )
    placement = discover(fs=fs)
    assert placement.version == NONE and not placement.directories
    assert "cgroup_parent" in placement.reason and "Delegate=yes" in placement.reason
    assert "watches" in placement.describe()
    assert fs.writes == []


def test_a_read_only_ancestor_is_passed_over(tmp_path: Path) -> None:
    fs = _service_host(tmp_path)
    fs.read_only.add(fs.root / "system.slice")
    placement = discover(fs=fs)
    # The next one up, the root, enables memory for its children.
    assert placement.directories == (fs.root / "ffdl",) and placement.origin == "ancestor"


def test_the_cgroup_systemd_delegates_to_the_service_is_used_once_it_is_empty(
    tmp_path: Path,
) -> None:
    # Delegate=yes with DelegateSubgroup=supervisor: the platform runs in a child of its
    # delegated cgroup, which holds no process and may enable controllers itself.
    fs = v2_tree(
        tmp_path,
        {
            "": (ALL, ALL, "1\n"),
            "system.slice": (ALL, ALL, ""),
            "system.slice/ffdl.service": (ALL, "", ""),
            "system.slice/ffdl.service/supervisor": ("", "", "4242\n"),
        },
        own="/system.slice/ffdl.service/supervisor",
    )
    service = fs.root / "system.slice/ffdl.service"
    fs.delegated_to_us.add(service)
    placement = discover(fs=fs)
    assert placement.origin == "delegated"
    assert placement.directories == (service / "ffdl",)
    assert {"memory", "cpu"} <= fs.enabled(service)
    assert fs.enabled(service / "ffdl") == {"cpu", "memory"}


def test_a_delegated_cgroup_that_still_holds_processes_is_left_alone(tmp_path: Path) -> None:
    fs = _service_host(tmp_path)
    fs.delegated_to_us.add(fs.root / "system.slice/ffdl.service")
    placement = discover(fs=fs)
    # The kernel would refuse: the slice above, which already enables memory, is used.
    assert placement.origin == "ancestor"
    assert placement.directories == (fs.root / "system.slice" / "ffdl",)


def test_the_root_cgroup_holds_learners_in_an_ffdl_subtree(tmp_path: Path) -> None:
    fs = v2_tree(tmp_path, {"": (ALL, "memory", "1 4242\n")}, own="/")
    placement = discover(fs=fs)
    assert placement.origin == "own" and placement.directories == (fs.root / "ffdl",)
    assert not placement.cpu  # the root does not give cpu to its children here


def test_looking_without_creating_writes_nothing(tmp_path: Path) -> None:
    fs = _service_host(tmp_path)
    assert discover(create=False, fs=fs).version == NONE  # no subtree yet: nothing to clean
    assert fs.writes == []
    discover(fs=fs)
    found = discover(create=False, fs=fs)
    assert found.directories == (fs.root / "system.slice" / "ffdl",)


@pytest.mark.parametrize("spelling", ["/ffdl.slice", "ffdl.slice", "{root}/ffdl.slice"])
def test_a_configured_cgroup_parent_is_used_and_given_memory(tmp_path: Path, spelling: str) -> None:
    fs = _service_host(tmp_path)
    (fs.root / "ffdl.slice").mkdir()
    (fs.root / "ffdl.slice/cgroup.controllers").write_text(ALL)
    (fs.root / "ffdl.slice/cgroup.subtree_control").write_text("")
    (fs.root / "ffdl.slice/cgroup.procs").write_text("")
    placement = discover(spelling.format(root=fs.root), fs=fs)
    assert placement.origin == "cgroup_parent"
    assert placement.directories == (fs.root / "ffdl.slice",)
    assert fs.enabled(fs.root / "ffdl.slice") == {"cpu", "memory"}
    assert placement.learner_directories("l1") == [fs.root / "ffdl.slice" / "l1"]


def _bad_parent(tmp: Path, available: str, enabled: str, procs: str) -> FabricatedCgroupFs:
    fs = _service_host(tmp)
    parent = fs.root / "jobs"
    parent.mkdir()
    (parent / "cgroup.controllers").write_text(available)
    (parent / "cgroup.subtree_control").write_text(enabled)
    (parent / "cgroup.procs").write_text(procs)
    return fs


@pytest.mark.parametrize(
    ("parent", "available", "procs", "read_only", "message"),
    [
        ("/no/such", ALL, "", False, "does not exist"),
        ("/jobs", ALL, "", True, "is not writable"),
        ("/jobs", "cpu pids", "", False, "lacks the memory controller"),
        ("/jobs", ALL, "77\n", False, "holds processes"),
    ],
)
def test_a_cgroup_parent_that_cannot_hold_learners_is_refused_and_nothing_changes(
    tmp_path: Path, parent: str, available: str, procs: str, read_only: bool, message: str
) -> None:
    fs = _bad_parent(tmp_path, available, "", procs)
    if read_only:
        fs.read_only.add(fs.root / "jobs")
    before = sorted(p.relative_to(fs.root) for p in fs.root.rglob("*"))
    with pytest.raises(CgroupParentError, match=message) as refused:
        discover(parent, fs=fs)
    assert str(fs.root / parent.lstrip("/")) in str(refused.value)
    assert fs.writes == []
    assert sorted(p.relative_to(fs.root) for p in fs.root.rglob("*")) == before
    assert (fs.root / "jobs/cgroup.subtree_control").read_text() == ""


def test_a_cgroup_parent_with_processes_but_memory_already_enabled_is_fine(
    tmp_path: Path,
) -> None:
    # Only the root can be like this on a real host, but the rule is the kernel's.
    fs = _bad_parent(tmp_path, ALL, "memory", "77\n")
    placement = discover("/jobs", fs=fs)
    assert placement.version == V2 and placement.directories == (fs.root / "jobs",)


def test_v1_puts_learners_under_this_process_s_memory_and_cpu_cgroups(tmp_path: Path) -> None:
    fs = v1_tree(tmp_path, own="/platform")
    placement = discover(fs=fs)
    assert placement.version == V1 and placement.origin == "own" and placement.cpu
    assert placement.learner_directories("l1") == [
        fs.root / "memory/platform/l1",
        fs.root / "cpu/platform/l1",
    ]
    assert fs.writes == []


def test_v1_without_the_cpu_hierarchy_holds_memory_only(tmp_path: Path) -> None:
    fs = v1_tree(tmp_path, own="/platform", controllers=("memory",))
    placement = discover(fs=fs)
    assert placement.directories == (fs.root / "memory/platform",) and not placement.cpu
    assert "CPU not limited" in placement.describe()


def test_v1_with_a_cgroup_parent(tmp_path: Path) -> None:
    fs = v1_tree(tmp_path, own="/platform")
    with pytest.raises(CgroupParentError, match="does not exist"):
        discover("/ffdl", fs=fs)
    (fs.root / "memory/ffdl").mkdir()
    placement = discover("/ffdl", fs=fs)
    assert placement.origin == "cgroup_parent"
    assert placement.directories == (fs.root / "memory/ffdl",) and not placement.cpu


def test_no_cgroup_filesystem_at_all(tmp_path: Path) -> None:
    fs = FabricatedCgroupFs(tmp_path / "nothing", tmp_path / "self-cgroup")
    (tmp_path / "self-cgroup").write_text("0::/\n")
    placement = discover(fs=fs)
    assert placement.version == NONE and "no cgroup filesystem" in placement.reason
    assert placement.as_dict()["memory"] == "watchdog"
    with pytest.raises(CgroupParentError, match="no memory cgroup controller"):
        discover("/ffdl", fs=fs)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b"])
def test_no_learner_name_ever_names_the_parent_itself(tmp_path: Path, name: str) -> None:
    # Cleaning up after a learner without a cgroup must never kill the platform's own.
    placement = discover(fs=v1_tree(tmp_path, own="/platform"))
    with pytest.raises(ValueError, match="not a learner cgroup name"):
        placement.learner_directories(name)
    assert LearnerCgroup.existing(name).directories == []
