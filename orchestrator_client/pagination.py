"""Lists, one item at a time: follow each page's ``next`` link until it is null.

The API pages two ways (docs/api.md, "Lists, filters and pages"): by page number (every
list but a run's events) and by signed cursor (a run's events). Both answers carry a
``next`` URL that keeps the query's other parameters, so one iterator serves both: it
asks for the first page, then for each ``next`` exactly as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from orchestrator_client.types import Page

Item = TypeVar("Item")

# Fetches one page: the first with (path, params), the others by their absolute URL.
PageFetcher = Callable[[str, dict[str, Any] | None], Any]


class Paginator(Generic[Item]):
    """An iterable over every item of a list; ``pages()`` gives the pages themselves.

    Nothing is fetched until it is iterated; each iteration starts again from the first
    page. ``limit`` stops after that many items (and fetches no page beyond them).
    """

    def __init__(
        self,
        fetch: PageFetcher,
        path: str,
        params: dict[str, Any] | None = None,
        *,
        limit: int | None = None,
    ) -> None:
        self._fetch = fetch
        self._path = path
        self._params = {key: value for key, value in (params or {}).items() if value is not None}
        self._limit = limit

    def pages(self) -> Iterator[Page[Item]]:
        page: Page[Item] = self._fetch(self._path, self._params)
        yield page
        while page["next"]:
            page = self._fetch(page["next"], None)
            yield page

    def __iter__(self) -> Iterator[Item]:
        seen = 0
        if self._limit is not None and self._limit <= 0:
            return
        for page in self.pages():
            for item in page["results"]:
                yield item
                seen += 1
                if self._limit is not None and seen >= self._limit:
                    return

    def all(self) -> list[Item]:
        """Every item, in a list."""
        return list(self)
