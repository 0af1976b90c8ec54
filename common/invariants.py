"""The registry of system invariants that `manage.py check_invariants` verifies.

Each app declares its checks in its own `invariants.py` with ``@invariant``; a check
returns a list of human-readable violations (empty when it holds). Checks are set-based
SQL over the whole database and report at most ``LIMIT`` examples each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.utils.module_loading import autodiscover_modules

LIMIT = 50

Check = Callable[[], list[str]]


@dataclass(frozen=True)
class Invariant:
    name: str
    description: str
    check: Check


_registry: dict[str, Invariant] = {}


def invariant(name: str, description: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        _registry[name] = Invariant(name, description, check)
        return check

    return register


def all_invariants() -> list[Invariant]:
    autodiscover_modules("invariants")
    return sorted(_registry.values(), key=lambda item: item.name)


def check_all() -> dict[str, list[str]]:
    """Every invariant's violations, by name (empty lists when it holds)."""
    return {item.name: item.check() for item in all_invariants()}
