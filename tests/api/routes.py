"""The API's routes, read from the URLconf, so that tests cover a new route automatically."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

API_PREFIX = "api/v1/"
METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True)
class Route:
    route: str  # Django route syntax: "api/v1/runs/<uuid:run_id>/start"
    name: str
    methods: tuple[str, ...]
    view: Any

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(part.split(">")[0].split(":")[-1] for part in self.route.split("<")[1:])

    def accepts(self, method: str, parameter: str) -> bool:
        """Whether ``method`` takes the query ``parameter`` (ApiView.queries)."""
        query = getattr(self.view, "queries", {}).get(method)
        return query is not None and parameter in query().fields

    def path(self, **values: object) -> str:
        path = self.route
        for part in self.route.split("<")[1:]:
            placeholder = "<" + part.split(">")[0] + ">"
            name = placeholder.strip("<>").split(":")[-1]
            if name not in values:
                raise AssertionError(f"no value for <{name}> in {self.route}: teach the test")
            path = path.replace(placeholder, str(values[name]))
        return "/" + path

    def __str__(self) -> str:
        return f"{'/'.join(self.methods)} /{self.route}"


def _walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        else:
            yield route, pattern


def is_public(view: Any) -> bool:
    """A route that takes no API key (its URL's token is the credential)."""
    return getattr(view, "authentication_classes", None) == ()


def api_routes(*, public: bool = False) -> list[Route]:
    """The routes that take an API key; with ``public``, those that take none instead
    (``test_auth`` holds that list to what is meant to be public)."""
    routes = []
    for route, pattern in _walk(get_resolver().url_patterns, ""):
        if not route.startswith(API_PREFIX):
            continue
        view = pattern.callback.view_class  # type: ignore[attr-defined]
        if is_public(view) != public:
            continue
        methods = tuple(method for method in METHODS if hasattr(view, method))
        routes.append(Route(route, str(pattern.name), methods, view))
    assert routes, "no API routes found"
    return routes


def routes_with(parameter: str) -> list[Route]:
    return [route for route in api_routes() if parameter in route.parameters]


def routes_without_parameters() -> list[Route]:
    return [route for route in api_routes() if not route.parameters]


def takes_json(route: Route) -> bool:
    """Whether its POST takes a JSON body (a file upload takes multipart)."""
    parsers = getattr(route.view, "parser_classes", ())
    return not any(parser.media_type == "multipart/form-data" for parser in parsers)


def post_routes() -> list[Route]:
    """The routes whose POST takes JSON (the multipart upload is tested on its own:
    tests/artifacts)."""
    return [route for route in api_routes() if "post" in route.methods and takes_json(route)]
