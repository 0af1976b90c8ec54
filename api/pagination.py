"""Pages of a list, with a capped page size (``API_PAGE_SIZE``, ``API_MAX_PAGE_SIZE``).

Two kinds, validated with the rest of a list's query parameters: a malformed value is a
400, and a page size above the cap is served at the cap.

- Page numbers (``PageQuery``, ``paginate``): ``page`` and ``page_size``, an envelope with
  the total ``count``; a page past the end is a 404. Two queries a page.
- A cursor over the primary key (``CursorQuery``, ``paginate_by_id``), for tables that
  only grow (a run's events): ``next`` and ``previous`` links carry an opaque, signed
  ``cursor``, and a page is one query that never counts the table, so its cost does not
  grow with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from django.conf import settings
from django.core import signing
from django.core.paginator import EmptyPage, Paginator
from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

from common.filters import MAX_BIGINT

PAGE_SIZE_HELP = "Rows per page; larger values are served at the maximum (500 by default)."


class PageQuery(serializers.Serializer[Any]):
    """The query parameters of a list paginated by page number."""

    page = serializers.IntegerField(min_value=1, required=False, help_text="1-based page number.")
    page_size = serializers.IntegerField(min_value=1, required=False, help_text=PAGE_SIZE_HELP)


def page_size_for(requested: int | None) -> int:
    if requested is None:
        return int(settings.API_PAGE_SIZE)
    return min(requested, int(settings.API_MAX_PAGE_SIZE))


def paginate(
    request: Request, queryset: QuerySet[Any], *, page: int | None, page_size: int | None
) -> tuple[dict[str, Any], list[Any]]:
    """The page's envelope (count, next, previous) and its rows: two queries."""
    size = page_size_for(page_size)
    paginator = Paginator(queryset, size)
    number = page or 1
    try:
        current = paginator.page(number)
    except EmptyPage as exc:
        raise NotFound(f"page {number} does not exist") from exc
    return _envelope(request, number, paginator.count, current.has_next()), list(
        current.object_list
    )


Counted = Callable[[int, int], tuple[int | None, list[Any]]]


def paginate_counted(
    request: Request, read: Counted, *, page: int | None, page_size: int | None
) -> tuple[dict[str, Any], list[Any]]:
    """``paginate``'s envelope and rows, read by one statement that counts as well:
    ``read(limit, offset)`` returns how many rows there are in all (None with no row on
    the page) and the page's rows. An empty page past the first is a 404, as ever."""
    size = page_size_for(page_size)
    number = page or 1
    offset = (number - 1) * size
    if offset > MAX_BIGINT:  # no table holds that many rows; PostgreSQL would refuse it
        raise NotFound(f"page {number} does not exist")
    count, rows = read(size, offset)
    if not rows and number > 1:
        raise NotFound(f"page {number} does not exist")
    count = count or 0
    return _envelope(request, number, count, (number - 1) * size + len(rows) < count), rows


def _envelope(request: Request, number: int, count: int, has_next: bool) -> dict[str, Any]:
    url = request.build_absolute_uri()
    return {
        "count": count,
        "next": replace_query_param(url, "page", number + 1) if has_next else None,
        "previous": replace_query_param(url, "page", number - 1) if number > 1 else None,
    }


def paginated(
    item: type[serializers.Serializer[Any]], name: str
) -> type[serializers.Serializer[Any]]:
    """The serializer of one page of ``item`` rows (for the OpenAPI schema)."""
    fields: dict[str, Any] = {
        "count": serializers.IntegerField(help_text="Rows matching, over all pages."),
        "next": serializers.URLField(allow_null=True, help_text="The next page, or null."),
        "previous": serializers.URLField(allow_null=True, help_text="The previous page, or null."),
        "results": item(many=True),
    }
    return type(name, (serializers.Serializer,), fields)


# --------------------------------------------------------------------------- cursor
INVALID_CURSOR = "invalid cursor: use a `next` or `previous` link exactly as it was given"
FOLLOW_NEXT = (
    "this list is paginated by cursor, not by page number: follow the `next` link of "
    "each answer (and `previous` to go back)"
)
CURSOR_SALT = "api.pagination.cursor"
_CURSOR_MAX_LENGTH = 200  # a signed cursor is about 60 characters


def _signer() -> signing.Signer:
    # Per call: the key is read from settings (SECRET_KEY and its fallbacks) when built.
    return signing.Signer(salt=CURSOR_SALT, sep=".")


@dataclass(frozen=True)
class Cursor:
    """A page of the rows whose key is after ``key`` (a ``next`` link) or before it (a
    ``previous`` link).

    Encoded signed, so that a cursor the API did not write, or one edited by hand, is
    refused rather than read as another position; a client only ever copies links."""

    key: int
    before: bool = False

    def encode(self) -> str:
        return str(_signer().sign_object(["before" if self.before else "after", self.key]))

    @classmethod
    def decode(cls, token: str) -> Cursor:
        """The cursor ``token`` stands for; ``ValueError`` for anything this module did
        not write (malformed, cut, edited, or signed under a retired SECRET_KEY)."""
        if len(token) > _CURSOR_MAX_LENGTH:
            raise ValueError("too long")
        try:
            value = _signer().unsign_object(token)
        except signing.BadSignature as exc:
            raise ValueError("not a cursor") from exc
        match value:
            case ["after" | "before" as side, int(key)] if 1 <= key <= MAX_BIGINT:
                return cls(key=key, before=side == "before")
        raise ValueError("not a cursor")  # signed, but not a shape this module writes


class CursorQuery(serializers.Serializer[Any]):
    """The query parameters of a list paginated by cursor."""

    cursor = serializers.CharField(
        required=False,
        help_text="Opaque: taken from a `next` or `previous` link; the first page without it.",
    )
    page_size = serializers.IntegerField(min_value=1, required=False, help_text=PAGE_SIZE_HELP)

    # Parameters refused with an explanation rather than as unknown.
    refused: ClassVar[dict[str, str]] = {"page": FOLLOW_NEXT}

    def validate_cursor(self, value: str) -> Cursor:
        try:
            return Cursor.decode(value)
        except ValueError as exc:
            raise serializers.ValidationError(INVALID_CURSOR, code="invalid") from exc


CursorRead = Callable[[Cursor | None, int], list[dict[str, Any]]]


def paginate_by_id(
    request: Request, read: CursorRead, *, cursor: Cursor | None, page_size: int | None
) -> tuple[dict[str, Any], list[Any]]:
    """The page's envelope (next, previous) and its rows (dicts), in ascending ``id``: one
    read, never a COUNT. ``read(cursor, limit)`` returns, in ascending id, the ``limit`` rows
    just after the cursor (the first ones without one) or, for a ``previous`` link's,
    just before it; a page reads one row more than it shows, which says whether there
    is more."""
    size = page_size_for(page_size)
    rows = read(cursor, size + 1)
    more = len(rows) > size
    if cursor is not None and cursor.before:
        rows = rows[-size:]  # the nearest before it
        has_next, has_previous = True, more  # the rows after it are those we came from
    else:
        rows = rows[:size]
        has_next, has_previous = more, cursor is not None
    url = request.build_absolute_uri()

    def link(to: Cursor) -> str:
        return replace_query_param(url, "cursor", to.encode())

    envelope = {
        "next": link(Cursor(rows[-1]["id"])) if rows and has_next else None,
        "previous": link(Cursor(rows[0]["id"], before=True)) if rows and has_previous else None,
    }
    return envelope, rows


def cursor_paginated(
    item: type[serializers.Serializer[Any]], name: str
) -> type[serializers.Serializer[Any]]:
    """The serializer of one cursor page of ``item`` rows (for the OpenAPI schema)."""
    fields: dict[str, Any] = {
        "next": serializers.URLField(
            allow_null=True, help_text="The next page, or null when there is none yet."
        ),
        "previous": serializers.URLField(
            allow_null=True, help_text="The previous page, or null on the first."
        ),
        "results": item(many=True),
    }
    return type(name, (serializers.Serializer,), fields)
