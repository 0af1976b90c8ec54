"""Page-number pagination with a capped page size (``API_PAGE_SIZE``, ``API_MAX_PAGE_SIZE``).

``page`` and ``page_size`` are validated with the rest of a list's query parameters
(``PageQuery``): a malformed value is a 400, a page past the end a 404, and a page size
above the cap is served at the cap.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.paginator import EmptyPage, Paginator
from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param


class PageQuery(serializers.Serializer[Any]):
    """The query parameters every list accepts."""

    page = serializers.IntegerField(min_value=1, required=False, help_text="1-based page number.")
    page_size = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text="Rows per page; larger values are served at the maximum (500 by default).",
    )


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
    url = request.build_absolute_uri()
    envelope = {
        "count": paginator.count,
        "next": replace_query_param(url, "page", number + 1) if current.has_next() else None,
        "previous": replace_query_param(url, "page", number - 1) if number > 1 else None,
    }
    return envelope, list(current.object_list)


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
