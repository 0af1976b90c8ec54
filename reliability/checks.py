"""After the storm: is everything accounted for? (Django must be set up by the caller.)

The same checks close `make chaos` and `make load`: every run reached a terminal state,
every attempt's ledger settles (charged + refunded = reserved), no step attempt was
charged twice, and every registered invariant (`manage.py check_invariants`) holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Consistency:
    statuses: Counter[str] = field(default_factory=Counter)
    stuck: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)
    charged_twice: list[str] = field(default_factory=list)
    invariants: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.stuck or self.unsettled or self.charged_twice or any(self.invariants.values())
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs_by_status": dict(sorted(self.statuses.items())),
            "runs_stuck": self.stuck,
            "ledgers_unsettled": self.unsettled,
            "step_attempts_charged_twice": self.charged_twice,
            "invariants": {
                "clean": not any(self.invariants.values()),
                "violations": {k: v for k, v in self.invariants.items() if v},
            },
        }


def with_descendants(run_ids: list[str]) -> list[str]:
    """``run_ids`` and every child run they started and every fork made of them, at any
    depth: their steps, charges and settlement are checked like those of the runs
    submitted."""
    from django.db.models import Q

    from runs.models import Run

    found, frontier = list(run_ids), list(run_ids)
    while frontier:
        children = Run.objects.filter(
            Q(parent_run__pk__in=frontier) | Q(forked_from_run__pk__in=frontier)
        )
        frontier = [str(pk) for pk in children.values_list("pk", flat=True)]
        found += frontier
    return found


def non_terminal(run_ids: list[str]) -> list[str]:
    from runs.models import Run

    return [
        str(pk)
        for pk in Run.objects.filter(pk__in=with_descendants(run_ids))
        .exclude(status__in=TERMINAL)
        .values_list("pk", flat=True)
    ]


def check_runs(run_ids: list[str]) -> Consistency:
    """Every check, over the runs in ``run_ids`` (and the invariants over everything)."""
    from django.db.models import F

    from billing.models import Reservation
    from common.invariants import check_all
    from runs.invariants import charged_unlike_costs
    from runs.models import Run

    result = Consistency()
    runs = Run.objects.filter(pk__in=with_descendants(run_ids))
    result.statuses = Counter(runs.values_list("status", flat=True))
    result.stuck = [
        f"{pk} {status}"
        for pk, status in runs.exclude(status__in=TERMINAL).values_list("pk", "status")
    ]
    reservations = Reservation.objects.filter(run_id__in=runs.values("pk"))
    terminal = runs.filter(status__in=TERMINAL).values("pk")
    result.unsettled = [
        f"run {r.run_id} attempt {r.attempt_number}: reserved {r.reserved}, "
        f"charged {r.charged}, refunded {r.refunded}, "
        f"settled {'yes' if r.settled_at else 'no'}"
        for r in reservations.filter(run_id__in=terminal).exclude(
            reserved=F("charged") + F("refunded"), settled_at__isnull=False
        )
    ]
    # A step attempt's charge is drawn on its run attempt's reservation in the recording
    # that adds its cost to the step's row, fenced by the step's status and attempt: a
    # reservation that charged other than its steps cost drew a charge twice (or without
    # its recording).
    result.charged_twice = [
        f"run {run_id} attempt {number}: charged {charged}, its steps cost {costs}"
        for run_id, number, charged, costs in charged_unlike_costs(reservations)
    ]
    result.invariants = check_all()
    return result


def detail_lines(
    lists: list[tuple[str, list[Any]]],
    invariants: dict[str, list[str]],
    log_errors: dict[str, int],
    log_errors_title: str,
) -> list[str]:
    """The report's tail shared by chaos and load: every non-empty list of findings (at most
    20 items each), the violations of each invariant, and the most frequent log errors."""
    lines: list[str] = []
    for title, items in lists:
        if items:
            lines += ["", f"{title}:"] + [f"  - {item}" for item in items[:20]]
    for name, violations in invariants.items():
        lines += ["", f"invariant {name}:"] + [f"  - {v}" for v in violations[:20]]
    if log_errors:
        lines += ["", f"{log_errors_title}:"]
        lines += [f"  {n:5d}  {gist}" for gist, n in log_errors.items()]
    return lines
