"""The registry of system invariants that `manage.py check_invariants` verifies.

Each app declares its checks in its own `invariants.py` with ``@invariant``; a check
returns a list of human-readable violations (empty when it holds). Checks are set-based
SQL over the whole database and report at most ``LIMIT`` examples each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

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


@cache
def _discover() -> None:
    autodiscover_modules("invariants")


def all_invariants() -> list[Invariant]:
    _discover()
    return sorted(_registry.values(), key=lambda item: item.name)


def check_all(*scopes: str) -> dict[str, list[str]]:
    """Every invariant's violations, by name (empty lists when it holds); with
    ``scopes``, only the invariants whose name begins with one of them (``"billing."``)."""
    return {
        item.name: item.check()
        for item in all_invariants()
        if not scopes or item.name.startswith(scopes)
    }


def violations(*scopes: str) -> dict[str, list[str]]:
    """``check_all``'s invariants that do not hold: ``{}`` when all hold."""
    return {name: found for name, found in check_all(*scopes).items() if found}
