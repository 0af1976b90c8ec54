"""The registry of system invariants that `manage.py check_invariants` verifies.

Each app declares its checks in its own `invariants.py` with ``@invariant``; a check
returns a list of human-readable violations (empty when it holds). Checks are set-based
SQL over the whole database and report at most ``LIMIT`` examples each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.apps import apps
from django.db import models
from django.db.models import Exists, OuterRef
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


Link = tuple[type[models.Model], "models.ForeignKey[Any, Any]"]


def unchecked_links(app_label: str) -> list[Link]:
    """The app's foreign keys that the database does not check (``db_constraint=False``),
    as (model, field), in model and field order; a view's (an unmanaged model) are its
    tables' links, checked there."""
    return [
        (model, field)
        for model in apps.get_app_config(app_label).get_models()
        if model._meta.managed
        for field in model._meta.concrete_fields
        # django-stubs leave the attribute out.
        if isinstance(field, models.ForeignKey) and not field.db_constraint  # type: ignore[attr-defined]
    ]


def orphans(app_label: str) -> list[str]:
    """Rows of the app whose unchecked link (``unchecked_links``) names a row that does
    not exist: what PostgreSQL's foreign-key check would have refused. One anti-join per
    link, at most ``LIMIT`` examples each."""
    problems = []
    for model, field in unchecked_links(app_label):
        parent = field.related_model._base_manager.filter(
            **{field.target_field.attname: OuterRef(field.attname)}
        )
        # By id: a model's default ordering may join the very parent that is missing.
        missing = (
            model._base_manager.filter(~Exists(parent), **{f"{field.attname}__isnull": False})
            .order_by("pk")
            .values_list("pk", field.attname)
        )
        problems += [
            f"{model._meta.verbose_name} {pk}: its {field.name} {value} does not exist"
            for pk, value in missing[:LIMIT]
        ]
    return problems
