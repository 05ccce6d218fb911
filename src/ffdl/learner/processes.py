"""The process table as /proc shows it: who is whose child, who is in which group.

The controller uses it to signal the command and everything it started. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path


def process_table() -> dict[int, tuple[int, int]]:
    """Every process's (parent pid, process group), read from /proc."""
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path("/proc", name, "stat").read_bytes()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; the fields after its last ')'
        # are state, ppid, pgrp.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2:
            table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def group_members(group: int) -> set[int]:
    """Processes in process group ``group`` (empty where there is none)."""
    return {pid for pid, (_ppid, pgrp) in process_table().items() if pgrp == group}


def descendants(root: int) -> set[int]:
    """Every process below ``root`` in the process tree (``root`` itself excluded)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgrp) in process_table().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found
