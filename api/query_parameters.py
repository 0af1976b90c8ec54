"""Query parameters: checked before a view looks anything up, and described for OpenAPI.

A list's parameters come from two places: its pagination (``api.pagination``: a
serializer of ``page`` or ``cursor``, and ``page_size``) and the FilterSet its selector
applies (``runs.filters``, ``billing.filters``). ``checked_query`` refuses a parameter
neither knows (a typo must not silently return everything) and every malformed value of
either, all at once, as one ``400 invalid_request``; the filters' part is then handed to
the selector, which applies the same FilterSet. ``filter_parameters`` describes a
FilterSet's parameters for the schema from the filters themselves.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.http import QueryDict
from drf_spectacular.plumbing import build_choice_description_list
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers
from rest_framework.request import Request

from api.errors import problems_detail
from common.filters import UNKNOWN, OrderingChoiceFilter, StrictFilterSet

INT32_MAX = 2**31 - 1


class NoQuery(serializers.Serializer[Any]):
    """No query parameters."""


def checked_query(
    request: Request,
    serializer_class: type[serializers.Serializer[Any]] = NoQuery,
    filterset_class: type[StrictFilterSet] | None = None,
) -> tuple[dict[str, Any], QueryDict, dict[str, Any]]:
    """The serializer's parameters validated, and the filters' parameters checked (for
    the selector to apply): as sent, and as the FilterSet cleans them (each of its
    filters by name, None where not given), for a selector that reads them in a
    statement of its own; ``ValidationError`` naming each parameter otherwise.

    An unknown parameter is reported alone, explained when the serializer's ``refused``
    names it (``page`` where pages go by cursor). ``?priority=`` is a malformed integer,
    not an omitted one: the serializer reads a plain dict (DRF reads a QueryDict like an
    HTML form, where empty means absent), and ``StrictFilterSet`` refuses empty values."""
    fields = serializer_class().fields
    filters = filterset_class.base_filters if filterset_class is not None else {}
    known = {*fields, *filters}
    unknown = sorted(key for key in request.query_params if key not in known)
    if unknown:
        refused: dict[str, str] = getattr(serializer_class, "refused", {})
        raise serializers.ValidationError({key: [refused.get(key, UNKNOWN)] for key in unknown})
    data: dict[str, Any] = {}
    filter_query = QueryDict(mutable=True)
    for key, values in request.query_params.lists():
        if key in fields:
            many = isinstance(fields[key], serializers.ListField | serializers.MultipleChoiceField)
            data[key] = values if many else values[-1]
        else:
            filter_query.setlist(key, values)
    serializer = serializer_class(data=data)
    errors: dict[str, Any] = {} if serializer.is_valid() else dict(serializer.errors)
    cleaned: dict[str, Any] = {}
    if filterset_class is not None:
        filterset = filterset_class(filter_query)
        errors.update(problems_detail(filterset.problems()))
        cleaned = getattr(filterset.form, "cleaned_data", {})
    if errors:
        raise serializers.ValidationError(errors)
    return dict(serializer.validated_data), filter_query, cleaned


class CommaSeparatedChoices(serializers.ListField):
    """``?exclude=outputs,plan`` (OpenAPI's form style, not exploded), or the parameter
    repeated: each value one of ``choices``, every one named by the error otherwise."""

    def __init__(self, choices: tuple[str, ...], **kwargs: Any) -> None:
        self.choices = choices
        super().__init__(child=serializers.CharField(), **kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        values = [part.strip() for value in data for part in str(value).split(",")]
        wrong = [value for value in values if value not in self.choices]
        if wrong:
            named = ", ".join(repr(value) for value in wrong)
            raise serializers.ValidationError(f"{named}: not one of {', '.join(self.choices)}.")
        return values


# --------------------------------------------------------------------------- OpenAPI
def _choices(filter_: django_filters.Filter) -> list[tuple[str, Any]]:
    return [(str(value), label) for value, label in filter_.extra["choices"]]


def _schema(filter_: django_filters.Filter) -> tuple[dict[str, Any], str]:
    """The JSON schema of one filter's value, and the description of its choices."""
    field = filter_.field
    if isinstance(field, forms.MultipleChoiceField):
        choices = _choices(filter_)
        item = {
            "enum": [value for value, _ in choices],
            "type": "string",
            "description": build_choice_description_list(choices),
        }
        return {"type": "array", "items": item}, ""
    if isinstance(field, forms.ChoiceField):
        choices = _choices(filter_)
        schema: dict[str, Any] = {
            "enum": [value for value, _ in choices],
            "type": "string",
            "minLength": 1,
        }
        if isinstance(filter_, OrderingChoiceFilter):
            schema["default"] = filter_.default
        return schema, build_choice_description_list(choices)
    if isinstance(field, forms.IntegerField):
        schema = {"type": "integer"}
        if field.max_value is not None:
            schema["maximum"] = field.max_value
        if field.min_value is not None:
            schema["minimum"] = field.min_value
        if isinstance(field.max_value, int) and field.max_value > INT32_MAX:
            schema["format"] = "int64"
        return schema, ""
    if isinstance(field, forms.DateTimeField):
        return {"type": "string", "format": "date-time"}, ""
    if isinstance(field, forms.UUIDField):
        return {"type": "string", "format": "uuid"}, ""
    if isinstance(field, forms.CharField):
        schema = {"type": "string"}
        if field.max_length is not None:
            schema["maxLength"] = field.max_length
        return schema, ""
    raise TypeError(
        f"no OpenAPI schema for {type(field).__name__}: teach api.query_parameters._schema"
    )


def filter_parameters(filterset_class: type[StrictFilterSet]) -> list[OpenApiParameter]:
    """The query parameters of ``filterset_class``, as the schema documents them."""
    parameters = []
    for name, filter_ in filterset_class.base_filters.items():
        schema, choices = _schema(filter_)
        help_text = str(filter_.extra.get("help_text") or "")
        description = "\n\n".join(part for part in (help_text, choices) if part)
        parameters.append(
            OpenApiParameter(
                name=name,
                type=schema,
                location=OpenApiParameter.QUERY,
                required=False,
                description=description,
            )
        )
    return parameters
