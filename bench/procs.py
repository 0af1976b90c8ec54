"""This host's processes as the benchmarks read them from /proc: descendants, resident
memory and CPU time; and ``CpuMeter``, the CPU of every part of a measurement read
together (docs/benchmark.md, "Where the CPU of many runs goes")."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from reliability.stack import parents

TICKS = os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``."""
    children: dict[int, list[int]] = {}
    for child, parent in parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, []):
            found.append(child)
            frontier.append(child)
    return found


def parent_of(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 2 :].split()[1])


def vm_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def proc_seconds(pid: int) -> tuple[int, float, float] | None:
    """(start time, CPU seconds of the process, of the children it reaped), or None when
    it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces; fields[0] is field 3, state.
    fields = stat[stat.rfind(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return int(fields[19]), (utime + stime) / TICKS, (cutime + cstime) / TICKS


def tree_seconds(root: int) -> float:
    """CPU seconds of ``root``, its live descendants and every child they reaped."""
    found = [proc_seconds(pid) for pid in (root, *descendants(root))]
    return sum(entry[1] + entry[2] for entry in found if entry)


def own_seconds() -> float:
    """This process's own CPU seconds (not its children's)."""
    found = proc_seconds(os.getpid())
    return found[1] if found else 0.0


def redis_seconds(url: str) -> float:
    import redis

    info = redis.Redis.from_url(url).info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


class CpuMeter:
    """CPU seconds by owner (PostgreSQL, the worker, the clients...), each read by its
    own function, all at one moment. A measurement reads it before and after, and
    ``per_unit`` says where the CPU between went: the figure that names what bounds a
    throughput on a machine whose cores every part shares."""

    def __init__(self, owners: Mapping[str, Callable[[], float | None]]) -> None:
        self.owners = dict(owners)

    def read(self) -> dict[str, float]:
        """Seconds by owner; an owner whose function says None (not running) is left out."""
        found = {owner: seconds() for owner, seconds in self.owners.items()}
        return {owner: value for owner, value in found.items() if value is not None}

    @staticmethod
    def per_unit(
        before: Mapping[str, float], after: Mapping[str, float], units: int, wall_s: float
    ) -> dict[str, float]:
        """Milliseconds of CPU per unit by owner (``cpu_ms_<owner>``), their total, and
        how busy the host's cores were on average (``cpu_busy``: the total over the wall
        time of every core)."""
        # Only the owners running at both readings (no web tier in a scenario without one).
        spent = {
            owner: max(0.0, seconds - before[owner])
            for owner, seconds in after.items()
            if owner in before
        }
        figures = {f"cpu_ms_{owner}": 1000 * seconds / units for owner, seconds in spent.items()}
        total = sum(spent.values())
        figures["cpu_ms_total"] = 1000 * total / units
        figures["cpu_busy"] = total / (wall_s * (os.cpu_count() or 1)) if wall_s > 0 else 0.0
        return figures
