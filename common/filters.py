"""Strict filtering for selectors: a query is applied whole or refused, never half-read.

A plain django-filter ``FilterSet`` forgives what an API must not: a parameter it does
not know is ignored (a typo silently returns everything), an empty value means "no
filter", and an invalid value leaves the rest applied. ``StrictFilterSet`` reports each
of those as a problem of the parameter it names, and ``filtered()`` raises
``QueryInvalid`` instead of returning rows when there is any. Selectors apply their
FilterSet with it; callers that check a query earlier (the API, before it looks anything
up) use ``problems()`` of the same FilterSet, so both agree on what is valid.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django_filters.fields import IsoDateTimeField

__all__ = [
    "MAX_BIGINT",
    "UNKNOWN",
    "IntegerFilter",
    "OrderingChoiceFilter",
    "Problems",
    "QueryData",
    "QueryInvalid",
    "StrictFilterSet",
    "UtcDateTimeFilter",
]

# A request's QueryDict, or a plain dict (a list value for a repeatable parameter).
QueryData = dict[str, Any]
# Parameter name -> what is wrong with it, in the FilterSet's declaration order.
Problems = dict[str, list[ValidationError]]

UNKNOWN = "unknown query parameter"
MAX_BIGINT = 2**63 - 1  # the largest id a bigint column holds


class QueryInvalid(Exception):
    """A query a selector refused; ``problems`` names each parameter and what is wrong."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        super().__init__(", ".join(problems))


class IntegerFilter(django_filters.Filter):
    """An integer (``NumberFilter`` would take decimals); ``min_value``/``max_value`` as
    Django's ``IntegerField``."""

    field_class = forms.IntegerField


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, in UTC. An offset is kept as given otherwise, and PostgreSQL
    refuses offsets past 15:59 (``-21:19``) with an error in the middle of the query."""

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError as exc:  # 0001-01-01T00:00+01:00 is before the first UTC instant
            raise ValidationError("Datetime value out of range.", code="overflow") from exc


class UtcDateTimeFilter(django_filters.Filter):
    """A date-time in ISO 8601, compared in UTC."""

    field_class = UtcIsoDateTimeField


class OrderingChoiceFilter(django_filters.ChoiceFilter):
    """One of ``orderings`` (a field, ``-`` for descending), ``default`` when omitted; the
    primary key breaks ties, in the same direction, so that pages are stable.

    One value only: django-filter's ``OrderingFilter`` takes a comma-separated list."""

    def __init__(self, *, orderings: tuple[str, ...], default: str, **kwargs: Any) -> None:
        assert default in orderings, default
        self.default = default
        super().__init__(choices=[(value, value) for value in orderings], **kwargs)

    def filter(self, qs: QuerySet[Any], value: Any) -> QuerySet[Any]:
        # Called with an empty value too when the parameter is omitted: the default applies.
        ordering = str(value or self.default)
        return qs.order_by(ordering, "-pk" if ordering.startswith("-") else "pk")


def _values(data: QueryData, name: str) -> list[Any]:
    """Every value given for ``name``, as a QueryDict or a plain dict holds them."""
    if hasattr(data, "getlist"):
        return list(data.getlist(name))
    value = data[name]
    return list(value) if isinstance(value, list | tuple) else [value]


class StrictFilterSet(django_filters.FilterSet):
    """A FilterSet that refuses unknown parameters and empty values.

    ``blank_allowed`` names the filters for which an empty value means "no filter" (a
    text search); anywhere else ``?priority=`` is a malformed value, not an omitted one.
    """

    blank_allowed: ClassVar[frozenset[str]] = frozenset()

    def problems(self) -> Problems:
        """What is wrong with the query; empty when it can be applied. Unknown
        parameters are reported alone: the rest may have been meant for another name."""
        data: QueryData = self.data or {}  # never None: a FilterSet keeps {} for no data
        unknown = sorted(name for name in data if name not in self.filters)
        if unknown:
            return {name: [ValidationError(UNKNOWN, code="invalid")] for name in unknown}
        errors = self.form.errors.as_data()
        problems: Problems = {}
        for name, filter_ in self.filters.items():
            if name in errors:
                problems[name] = errors[name]
            elif name in data and name not in self.blank_allowed and self._blank(filter_, name):
                problems[name] = [ValidationError("This field may not be blank.", code="blank")]
        return problems

    def _blank(self, filter_: django_filters.Filter, name: str) -> bool:
        values = _values(self.data or {}, name)
        if not isinstance(filter_.field, forms.MultipleChoiceField):
            values = values[-1:]  # a form reads the last value of a repeated parameter
        return any(value in ("", None) for value in values)

    def filtered(self) -> QuerySet[Any]:
        """The queryset with every filter applied; ``QueryInvalid`` when any problem."""
        problems = self.problems()
        if problems:
            raise QueryInvalid(problems)
        return self.qs
