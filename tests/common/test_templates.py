"""`${...}` templates: reference parsing, rendering, validation paths, `resolve_in`."""

from __future__ import annotations

import pickle
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.templates import (
    Reference,
    Template,
    TemplateError,
    UnresolvedReference,
    find_references,
    format_reference,
    parse_reference,
    render_value,
    resolve_in,
    secret_references,
    template_errors,
)
from tests.secret_spellings import every_spelling

CONTEXT: dict[str, Any] = {
    "variables": {"topic": "otters", "count": 3, "ratio": 0.5, "flag": True, "none": None},
    "tasks": {
        "gather": {
            "status": "completed",
            "steps": {
                "search": {"output": {"body": "Otters hold hands.", "items": [10, 20]}},
                "a b": {"output": [{"x": 1}]},
            },
        }
    },
    "steps": {"fetch-data": {"output": {"items": ["first", "second"], "meta": {"b": 2, "a": 1}}}},
}


def resolve(ref: Reference) -> Any:
    return resolve_in(CONTEXT, ref)


def render(text: str) -> Any:
    return Template.parse(text).render(resolve)


# --- parse_reference -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("variables.topic", ("variables", "topic")),
        (
            "tasks.gather.steps.search.output.body",
            ("tasks", "gather", "steps", "search", "output", "body"),
        ),
        ("steps.fetch.output.items[0]", ("steps", "fetch", "output", "items", 0)),
        ("steps.fetch-data.output", ("steps", "fetch-data", "output")),
        ("_private.x_1", ("_private", "x_1")),
        ('steps["a b"].output', ("steps", "a b", "output")),
        ("steps['a b'].output", ("steps", "a b", "output")),
        ('x["with \\"quote\\" and \\\\"]', ("x", 'with "quote" and \\')),
        ("x['it\\'s']", ("x", "it's")),
        ('x["a}b.c[0]"]', ("x", "a}b.c[0]")),
        ("x[12][0][3]", ("x", 12, 0, 3)),
        ("  variables.topic\t", ("variables", "topic")),
        ("x", ("x",)),
    ],
)
def test_parse_reference(text: str, expected: Reference) -> None:
    assert parse_reference(text) == expected


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("", "empty reference", 0),
        ("   ", "empty reference", 0),
        ("a.", "expected a name after '.'", 2),
        ("a..b", "expected a name after '.'", 2),
        (".a", "expected a name at the start of the reference", 0),
        ("1abc", "expected a name at the start of the reference", 0),
        ("a.1", "expected a name after '.'", 2),
        ("a b", "unexpected 'b' in reference", 2),
        ("a+b", "unexpected '+' in reference", 1),
        ("a[0", "expected ']' to close '['", 3),
        ("a[", "expected an integer index or a quoted key", 2),
        ("a[x]", "expected an integer index or a quoted key", 2),
        ("a[-1]", "non-negative", 2),
        ("a[ 0 ]", "expected an integer index or a quoted key", 2),
        ('a["x', "unterminated quoted key", 2),
        ('a["x\\q"]', "unknown escape", 4),
        ("a}", "unexpected '}' in reference", 1),
    ],
)
def test_parse_reference_errors(text: str, message: str, position: int) -> None:
    with pytest.raises(TemplateError) as caught:
        parse_reference(text)
    assert message in caught.value.message
    assert caught.value.position == position
    assert f"(at position {position})" in str(caught.value)


def test_template_error_is_a_value_error_and_pickles() -> None:
    error = TemplateError("bad", 3)
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (copy.message, copy.position) == ("bad", 3)


def test_format_reference() -> None:
    ref = ("tasks", "gather", "steps", "a b", "output", 0)
    assert format_reference(ref) == 'tasks.gather.steps["a b"].output[0]'
    assert format_reference(("x", 'q"\\', "0", "ok-1")) == 'x["q\\"\\\\"]["0"].ok-1'
    assert parse_reference(format_reference(("x", 'q"\\', "0", "ok-1"))) == (
        "x",
        'q"\\',
        "0",
        "ok-1",
    )


# --- Template.parse --------------------------------------------------------------------


def test_parse_splits_literals_and_references() -> None:
    template = Template.parse(
        "https://x.invalid/search?q=${variables.topic}&n=${ variables.count }"
    )
    assert template.parts == (
        "https://x.invalid/search?q=",
        ("variables", "topic"),
        "&n=",
        ("variables", "count"),
    )
    assert template.references == [("variables", "topic"), ("variables", "count")]
    assert not template.is_single_reference


def test_single_reference_detection() -> None:
    assert Template.parse("${steps.fetch-data.output}").is_single_reference
    assert Template.parse("${ steps.fetch-data.output }").is_single_reference
    assert not Template.parse(" ${a}").is_single_reference
    assert not Template.parse("${a}${b}").is_single_reference
    assert not Template.parse("plain").is_single_reference
    assert not Template.parse("").is_single_reference


def test_dollar_escape_and_lone_dollars() -> None:
    template = Template.parse("cost: $5, literal $${not.a.ref}, $$ and ${variables.topic}")
    assert template.references == [("variables", "topic")]
    assert template.render(resolve) == "cost: $5, literal ${not.a.ref}, $$ and otters"
    assert Template.parse("$${").render(resolve) == "${"
    assert Template.parse("$").render(resolve) == "$"
    # Escape only: no references, so the resolver is never consulted.
    assert Template.parse("$${x}").render(_never) == "${x}"


def test_quoted_key_may_contain_a_closing_brace() -> None:
    assert Template.parse('${x["}"]}!').parts == (("x", "}"), "!")


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("${", "unclosed '${'", 0),
        ("abc ${variables.topic", "unclosed '${'", 4),
        ("${}", "empty reference '${}'", 0),
        ("x ${  }", "empty reference '${}'", 2),
        ("${a.}", "expected a name after '.'", 4),
        ("${a b}", "unexpected 'b' in reference", 4),
        ("${a[0}", "expected ']' to close '['", 5),
        ("ok ${a} then ${", "unclosed '${'", 13),
    ],
)
def test_malformed_templates(text: str, message: str, position: int) -> None:
    with pytest.raises(TemplateError) as caught:
        Template.parse(text)
    assert message in caught.value.message
    assert caught.value.position == position


# --- rendering -------------------------------------------------------------------------


def _never(ref: Reference) -> Any:
    raise AssertionError(f"resolver called for {ref}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${variables.topic}", "otters"),
        ("${variables.count}", 3),
        ("${variables.ratio}", 0.5),
        ("${variables.flag}", True),
        ("${variables.none}", None),
        ("${steps.fetch-data.output.items}", ["first", "second"]),
        ("${steps.fetch-data.output.meta}", {"b": 2, "a": 1}),
    ],
)
def test_single_reference_keeps_the_json_type(text: str, expected: Any) -> None:
    result = render(text)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("q=${variables.topic}", "q=otters"),
        ("n=${variables.count}", "n=3"),
        ("r=${variables.ratio}", "r=0.5"),
        ("f=${variables.flag}", "f=true"),
        ("f=${variables.none}|", "f=|"),
        ("i=${steps.fetch-data.output.items}", 'i=["first","second"]'),
        ("m=${steps.fetch-data.output.meta}", 'm={"a":1,"b":2}'),
        ("${variables.topic}${variables.count}", "otters3"),
        (
            "Summarise ${tasks.gather.steps.search.output.body}",
            "Summarise Otters hold hands.",
        ),
    ],
)
def test_interpolation_formats_each_type(text: str, expected: str) -> None:
    assert render(text) == expected


def test_interpolating_false_and_nested_json() -> None:
    values: dict[str, Any] = {"f": False, "nested": {"z": [1, {"y": None}], "a": "é"}}
    result = Template.parse("${f}/${nested}").render(lambda ref: values[str(ref[0])])
    assert result == 'false/{"a":"\\u00e9","z":[1,{"y":null}]}'


def test_render_lets_unresolved_reference_propagate() -> None:
    with pytest.raises(UnresolvedReference):
        render("x ${variables.missing}")
    with pytest.raises(UnresolvedReference):
        render("${variables.missing}")


def test_render_value_renders_deeply_and_returns_a_new_value() -> None:
    params: dict[str, Any] = {
        "url": "https://x.invalid/search?q=${variables.topic}",
        "limit": "${variables.count}",
        "headers": {"X-Topic": "${variables.topic}", "${not.a.key}": 1},
        "items": ["${steps.fetch-data.output.items[1]}", 7, None, True, ["${variables.flag}"]],
        "body": "${steps.fetch-data.output.meta}",
        "plain": "no templates",
        "number": 1.5,
    }
    rendered = render_value(params, resolve)
    assert rendered == {
        "url": "https://x.invalid/search?q=otters",
        "limit": 3,
        "headers": {"X-Topic": "otters", "${not.a.key}": 1},
        "items": ["second", 7, None, True, [True]],
        "body": {"b": 2, "a": 1},
        "plain": "no templates",
        "number": 1.5,
    }
    assert params["url"] == "https://x.invalid/search?q=${variables.topic}"
    assert rendered["items"] is not params["items"]


def test_render_value_of_scalars() -> None:
    assert render_value("${variables.count}", resolve) == 3
    assert render_value(5, _never) == 5
    assert render_value(None, _never) is None
    assert render_value((1, "${variables.topic}"), resolve) == [1, "otters"]


# --- find_references / template_errors -------------------------------------------------


def test_find_references_in_document_order() -> None:
    value = {
        "a": "${x.one} and ${x.two}",
        "b": ["${x.three}", {"c": "${x.four}"}, 5],
        "${keys.are.not.templates}": "${x.one}",
    }
    assert find_references(value) == [
        ("x", "one"),
        ("x", "two"),
        ("x", "three"),
        ("x", "four"),
        ("x", "one"),
    ]
    assert find_references("${solo}") == [("solo",)]
    assert find_references(42) == []


def test_find_references_raises_on_malformed() -> None:
    with pytest.raises(TemplateError):
        find_references({"a": ["ok", "${broken"]})


def test_template_errors_reports_every_bad_string_with_its_path() -> None:
    params = {
        "url": "https://x.invalid/?q=${variables.topic",
        "headers": {"Authorization": "Bearer ${secrets.}", "Accept": "ok ${a.b}"},
        "items": [1, "fine", "${}", {"deep": ["${a[x]}"]}],
        "${bad key}": "keys are not templates",
    }
    errors = template_errors(params, "params")
    assert [path for path, _ in errors] == [
        "params.url",
        "params.headers.Authorization",
        "params.items[2]",
        "params.items[3].deep[0]",
    ]
    messages = dict(errors)
    assert "unclosed '${'" in messages["params.url"]
    assert "expected a name after '.'" in messages["params.headers.Authorization"]
    assert "empty reference" in messages["params.items[2]"]
    assert "position" in messages["params.items[3].deep[0]"]


def test_template_errors_root_paths() -> None:
    assert template_errors("${", "when") == [("when", "unclosed '${' (at position 0)")]
    assert [p for p, _ in template_errors({"a": "${"}, "")] == ["a"]
    assert [p for p, _ in template_errors(["${"], "")] == ["[0]"]
    assert template_errors({"a": [1, "${ok}"]}, "params") == []
    assert template_errors(object(), "x") == []


# --- resolve_in ------------------------------------------------------------------------


def test_resolve_in_walks_dicts_and_lists() -> None:
    assert resolve(("tasks", "gather", "steps", "a b", "output", 0, "x")) == 1
    assert resolve(("variables",)) is CONTEXT["variables"]
    assert resolve_in({"t": (1, 2)}, ("t", 1)) == 2


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (("nope",), "cannot resolve nope: the context has no key 'nope'"),
        (
            ("tasks", "gather", "steps", "missing", "output"),
            "cannot resolve tasks.gather.steps.missing.output:"
            " tasks.gather.steps has no key 'missing'",
        ),
        (
            ("tasks", "gather", "steps", "a b", "output", 3),
            'cannot resolve tasks.gather.steps["a b"].output[3]: index 3 is out of range'
            ' for tasks.gather.steps["a b"].output (length 1)',
        ),
        (
            ("tasks", "gather", "status", 0),
            "cannot resolve tasks.gather.status[0]: tasks.gather.status is a string"
            " and cannot be indexed with [0]",
        ),
        (
            ("variables", "none", "x"),
            "cannot resolve variables.none.x: variables.none is null and cannot be indexed"
            " with 'x'",
        ),
        (
            ("steps", "fetch-data", "output", "items", "first"),
            "steps.fetch-data.output.items is a list and cannot be indexed with 'first'",
        ),
        (("variables", 0), "variables is an object and cannot be indexed with [0]"),
        (("variables", "count", 0), "variables.count is a number"),
    ],
)
def test_resolve_in_errors_name_the_reference(ref: Reference, message: str) -> None:
    with pytest.raises(UnresolvedReference) as caught:
        resolve(ref)
    assert message in str(caught.value)
    assert caught.value.reference == ref
    assert isinstance(caught.value, LookupError)


def test_resolve_in_rejects_negative_indexes() -> None:
    with pytest.raises(UnresolvedReference, match="out of range"):
        resolve_in({"a": [1, 2]}, ("a", -1))


def test_unresolved_reference_pickles() -> None:
    error = UnresolvedReference("gone", ("a", 0))
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (copy.message, copy.reference) == ("gone", ("a", 0))


# --- properties ------------------------------------------------------------------------

_identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
# Keys are arbitrary text so that quoted keys (spaces, quotes, backslashes, braces) are
# exercised as well as plain names.
_keys = st.one_of(_identifiers, st.text(max_size=6))
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)
_contexts = st.dictionaries(_identifiers, _json, min_size=1, max_size=4)


@given(context=_contexts, data=st.data())
def test_single_reference_renders_exactly_the_value_at_the_path(
    context: dict[str, Any], data: st.DataObject
) -> None:
    root = data.draw(st.sampled_from(sorted(context)))
    path: list[str | int] = [root]
    value: Any = context[root]
    # Walk down a random distance, choosing a random existing key or index each time.
    while data.draw(st.booleans()):
        if isinstance(value, dict) and value:
            key = data.draw(st.sampled_from(sorted(value)))
        elif isinstance(value, list) and value:
            key = data.draw(st.integers(0, len(value) - 1))
        else:
            break
        path.append(key)
        value = value[key]
    ref = tuple(path)
    text = format_reference(ref)
    assert parse_reference(text) == ref

    template = Template.parse("${" + text + "}")
    assert template.is_single_reference
    result = template.render(lambda r: resolve_in(context, r))
    assert result is value


@given(st.text(alphabet=st.sampled_from(string.printable.replace("$", "")), max_size=200))
def test_text_without_dollars_renders_unchanged(text: str) -> None:
    template = Template.parse(text)
    assert template.references == []
    assert template.render(_never) == text


@given(st.text(max_size=60))
def test_parse_never_raises_anything_but_template_error(text: str) -> None:
    try:
        template = Template.parse(text)
    except TemplateError:
        return
    rendered = template.render(lambda ref: format_reference(ref))
    assert isinstance(rendered, str)


# --- secret_references -----------------------------------------------------------------
@every_spelling
def test_secret_references_finds_every_spelling_the_parser_accepts(spelling: str) -> None:
    assert secret_references(spelling) == [("", ("secrets", "TOKEN"))]
    nested = {"a": [{"b": spelling}], spelling: "a key", "c": 1}
    assert secret_references(nested, "params") == [
        ("params.a[0].b", ("secrets", "TOKEN")),
        (f"params.{spelling}", ("secrets", "TOKEN")),
    ]


def test_secret_references_ignores_other_roots_escapes_and_unparsed_text() -> None:
    value = {
        "a": "${variables.secrets} ${steps.secrets.output}",
        "b": "$${secrets.TOKEN}",  # the escape: the text ${secrets.TOKEN}, no reference
        "c": "${secrets.TOKEN",  # does not parse: rendering it fails before resolving
        "d": "secrets.TOKEN",
        "e": [None, 3, True],
    }
    assert secret_references(value) == []
    assert secret_references("${secrets}") == [("", ("secrets",))]
