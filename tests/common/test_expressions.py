"""The `when` expression language: syntax, precedence, semantics, errors and limits."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.expressions import MAX_DEPTH, MAX_LENGTH, Expression, ExpressionError, parsed
from common.templates import Reference, UnresolvedReference, resolve_in

CONTEXT: dict[str, Any] = {
    "tasks": {"gather": {"status": "completed", "steps": {"search": {"output": {"hits": 3}}}}},
    "variables": {
        "topic": "otters",
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "off": False,
        "none": None,
        "tags": ["a", "b"],
        "meta": {"lang": "en"},
        "empty_list": [],
        "empty_obj": {},
        "empty_str": "",
        "zero": 0,
    },
}


def resolve(ref: Reference) -> Any:
    return resolve_in(CONTEXT, ref)


def ev(source: str) -> Any:
    return Expression.parse(source).evaluate(resolve)


def parse_error(source: str) -> ExpressionError:
    with pytest.raises(ExpressionError) as caught:
        Expression.parse(source)
    return caught.value


def eval_error(source: str) -> ExpressionError:
    expression = Expression.parse(source)
    with pytest.raises(ExpressionError) as caught:
        expression.evaluate(resolve)
    return caught.value


def _never(ref: Reference) -> Any:
    raise AssertionError(f"resolver called for {ref}")


# --- literals and references -----------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("'single'", "single"),
        ('"double"', "double"),
        ("''", ""),
        (r"'it\'s'", "it's"),
        (r'"say \"hi\""', 'say "hi"'),
        (r"'back\\slash'", "back\\slash"),
        (r"'a\nb\tc'", "a\nb\tc"),
        ("\"mixed 'quotes'\"", "mixed 'quotes'"),
        ("42", 42),
        ("007", 7),
        ("3.5", 3.5),
        ("-2", -2),
        ("-2.25", -2.25),
        ("true", True),
        ("false", False),
        ("null", None),
        ("[]", []),
        ("[1, 'two', [3], null]", [1, "two", [3], None]),
        ("${variables.topic}", "otters"),
        ("${ variables.meta }", {"lang": "en"}),
        ('${variables["tags"][1]}', "b"),
    ],
)
def test_literals_and_references(source: str, expected: Any) -> None:
    result = ev(source)
    assert result == expected
    assert type(result) is type(expected)


def test_a_condition_on_a_tasks_status() -> None:
    assert Expression.parse("${tasks.gather.status} == 'completed'").truthy(resolve)
    assert not Expression.parse("${tasks.gather.status} == 'failed'").truthy(resolve)


def test_source_references_and_repr() -> None:
    expression = Expression.parse("${a.b} == 1 or ${c[0]} in [${a.b}]")
    assert expression.source == "${a.b} == 1 or ${c[0]} in [${a.b}]"
    assert expression.references == [("a", "b"), ("c", 0), ("a", "b")]
    assert Expression.parse("1 + 2").references == []
    assert repr(Expression.parse("1")) == "Expression('1')"
    assert Expression.parse("1 + 2") == Expression.parse("1 + 2")
    assert hash(Expression.parse("1 + 2")) == hash(Expression.parse("1 + 2"))


# --- operators -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # arithmetic
        ("1 + 2", 3),
        ("5 - 7", -2),
        ("3 * 4", 12),
        ("7 / 2", 3.5),
        ("6 / 3", 2.0),
        ("7 % 3", 1),
        ("7.5 % 2", 1.5),
        ("1 + 0.5", 1.5),
        ("'ab' + 'cd'", "abcd"),
        ("${variables.topic} + '!'", "otters!"),
        ("- ${variables.count}", -3),
        ("--3", 3),
        # equality
        ("1 == 1", True),
        ("1 == 1.0", True),
        ("1 != 1.0", False),
        ("'1' == 1", False),
        ("'1' != 1", True),
        ("true == 1", False),
        ("false == 0", False),
        ("null == null", True),
        ("null == false", False),
        ("null != 0", True),
        ("${variables.none} == null", True),
        ("[1, 2] == [1.0, 2]", True),
        ("[1, 2] == [2, 1]", False),
        ("[true] == [1]", False),
        ("${variables.meta} == ${variables.meta}", True),
        ("'abc' == 'abc'", True),
        # ordering
        ("1 < 2", True),
        ("2 < 1", False),
        ("2 <= 2", True),
        ("3 > 2.5", True),
        ("2 >= 3", False),
        ("'apple' < 'banana'", True),
        ("'b' >= 'a'", True),
        # membership
        ("'a' in ${variables.tags}", True),
        ("'z' in ${variables.tags}", False),
        ("'z' not in ${variables.tags}", True),
        ("1 in [1.0, 2]", True),
        ("'1' in [1, 2]", False),
        ("true in [1]", False),
        ("null in [null]", True),
        ("[1] in [[1], [2]]", True),
        ("'tt' in ${variables.topic}", True),
        ("'' in 'abc'", True),
        ("'lang' in ${variables.meta}", True),
        ("'en' in ${variables.meta}", False),
        ("'lang' not in ${variables.meta}", False),
        # logic
        ("true and true", True),
        ("true and false", False),
        ("false or true", True),
        ("false or false", False),
        ("not true", False),
        ("not null", True),
        ("not not 'x'", True),
        ("1 and 'x'", True),
        ("0 or ''", False),
        ("true and true and 0", False),
        ("false or false or 1", True),
    ],
)
def test_operators(source: str, expected: Any) -> None:
    result = ev(source)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("10 - 4 - 3", 3),  # left-associative
        ("24 / 4 / 2", 3.0),
        ("10 - 2 * 3 + 1", 5),
        ("7 % 4 * 2", 6),  # * / % share a level, left to right
        ("2 * 7 % 4", 2),
        ("-2 * 3", -6),
        ("-(2 + 3)", -5),
        ("- 2 - -3", 1),
        ("1 + 2 == 3", True),  # arithmetic binds tighter than comparison
        ("2 * 3 > 5", True),
        ("not 1 == 2", True),  # not binds looser than comparison: not (1 == 2)
        ("not 'a' in ['b']", True),
        ("true or false and false", True),  # and binds tighter than or
        ("(true or false) and false", False),
        ("not false and false", False),  # not binds tighter than and
        ("not (false and false)", True),
        ("false and false or true", True),
        ("1 < 2 and 2 < 3", True),
        ("1 == 1 == true", None),  # marker: chained comparisons are a parse error
    ],
)
def test_precedence(source: str, expected: Any) -> None:
    if expected is None:
        with pytest.raises(ExpressionError, match="cannot be chained"):
            Expression.parse(source)
        return
    result = ev(source)
    assert result == expected
    assert type(result) is type(expected)


def test_and_or_return_booleans() -> None:
    assert ev("'x' or 0") is True
    assert ev("'x' and [1]") is True
    assert ev("0 or ''") is False
    assert ev("[] and 1") is False


def test_short_circuit_skips_unevaluated_references() -> None:
    assert Expression.parse("false and ${never.resolved}").evaluate(_never) is False
    assert Expression.parse("true or ${never.resolved}").evaluate(_never) is True
    assert Expression.parse("0 and ${a} and ${b}").evaluate(_never) is False
    # The guard pattern: check a value exists before looking inside it.
    guarded = Expression.parse("${variables.none} != null and ${variables.none.x} == 1")
    assert guarded.evaluate(resolve) is False


def test_unevaluated_branch_type_errors_are_not_raised() -> None:
    assert ev("true or 'a' < 1") is True
    assert ev("false and 1 / 0") is False


def test_truthy() -> None:
    truthy = {"1", "'x'", "[0]", "${variables.meta}", "${variables.flag}", "0.5", "-1"}
    falsy = {
        "0",
        "0.0",
        "''",
        "null",
        "false",
        "[]",
        "${variables.empty_obj}",
        "${variables.empty_list}",
        "${variables.empty_str}",
        "${variables.zero}",
        "${variables.none}",
        "${variables.off}",
    }
    for source in truthy:
        assert Expression.parse(source).truthy(resolve) is True, source
    for source in falsy:
        assert Expression.parse(source).truthy(resolve) is False, source


def test_unresolved_reference_propagates() -> None:
    with pytest.raises(UnresolvedReference, match=r"variables\.missing"):
        ev("${variables.missing} == 1")


def test_resolver_exceptions_propagate_unchanged() -> None:
    # The resolver is our own code, so its bugs should surface as themselves.
    def broken(ref: Reference) -> Any:
        raise RuntimeError("resolver bug")

    with pytest.raises(RuntimeError, match="resolver bug"):
        Expression.parse("${a}").evaluate(broken)


# --- evaluation errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message", "position"),
    [
        ("'a' < 1", "'<' needs two numbers or two strings, not a string and a number", 4),
        ("1 >= 'a'", "'>=' needs two numbers or two strings", 2),
        ("true < false", "not a boolean and a boolean", 5),
        ("true > 0", "not a boolean and a number", 5),
        ("null < 1", "not null and a number", 5),
        ("[1] < [2]", "not a list and a list", 4),
        ("'a' - 'b'", "'-' needs numbers, not a string and a string", 4),
        ("'a' * 3", "'*' needs numbers, not a string and a number", 4),
        ("'a' + 1", "'+' needs numbers or two strings, not a string and a number", 4),
        ("1 + '1'", "'+' needs numbers or two strings", 2),
        ("[1] + [2]", "'+' needs numbers or two strings, not a list and a list", 4),
        ("true + 1", "not a boolean and a number", 5),
        ("null + 1", "not null and a number", 5),
        ("1 + 2 + 'x'", "not a number and a string", 6),
        ("${variables.meta} + 1", "not an object and a number", 18),
        ("1 / 0", "division by zero", 2),
        ("1 % 0", "division by zero", 2),
        ("1.5 / 0.0", "division by zero", 4),
        ("1 / (2 - 2)", "division by zero", 2),
        ("1 in 2", "'in' needs a list, string or object on the right, not a number", 2),
        ("1 in null", "not null", 2),
        ("1 not in true", "'not in' needs a list, string or object", 2),
        ("1 in 'abc'", "needs a string on the left, not a number", 2),
        ("-'a'", "unary '-' needs a number, not a string", 0),
        ("-true", "unary '-' needs a number, not a boolean", 0),
        ("1 + -${variables.tags}", "unary '-' needs a number, not a list", 4),
    ],
)
def test_type_errors_at_evaluation(source: str, message: str, position: int) -> None:
    error = eval_error(source)
    assert message in error.message
    assert error.position == position


def test_numeric_overflow_is_an_expression_error() -> None:
    huge = "9" * 400
    error = eval_error(f"{huge} / 1")
    assert "arithmetic error" in error.message
    big = "9" * 300 + ".0"
    assert "out of range" in eval_error(f"{big} * {big}").message
    assert "too large" in parse_error("9" * 400 + ".0").message


def test_evaluate_wraps_resolved_values_of_any_type() -> None:
    values: dict[str, Any] = {"obj": object(), "deep": []}
    node: list[Any] = values["deep"]
    for _ in range(5000):  # deeper than Python's recursion limit
        node.append([])
        node = node[0]

    def lookup(ref: Reference) -> Any:
        return values[str(ref[0])]

    for source in ("${obj} < 1", "-${obj}", "${obj} + 1", "1 in ${obj}"):
        with pytest.raises(ExpressionError):
            Expression.parse(source).evaluate(lookup)
    assert Expression.parse("${obj} == 1").evaluate(lookup) is False
    with pytest.raises(ExpressionError, match="nested too deeply"):
        Expression.parse("${deep} == ${deep}").evaluate(lookup)
    with pytest.raises(ExpressionError, match="nested too deeply"):
        Expression.parse("${deep} in [${deep}]").evaluate(lookup)


def test_expression_error_is_a_value_error_and_pickles() -> None:
    error = ExpressionError("bad", 7)
    assert isinstance(error, ValueError)
    assert str(error) == "bad (at position 7)"
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (copy.message, copy.position) == ("bad", 7)
    assert str(ExpressionError("whole")) == "whole"


# --- syntax errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message", "position"),
    [
        ("", "empty expression", 0),
        ("   \n\t", "empty expression", 0),
        ("'abc", "unterminated string", 0),
        ('1 == "abc', "unterminated string", 5),
        ("'a\\'", "unterminated string", 0),
        (r"'\q'", "unknown escape in string", 1),
        ("${a} = 1", "unexpected '='; use '==' to compare", 5),
        ("${a} === 1", "unexpected '='", 7),
        ("!${a}", "unexpected '!'; use 'not'", 0),
        ("1 && 2", "unexpected '&'; use 'and'", 2),
        ("1 || 2", "unexpected '|'; use 'or'", 2),
        ("1 2", "unexpected number 2; expected an operator or the end of the expression", 2),
        ("'a' 'b'", "unexpected string 'b'", 4),
        ("1 == 1 ${a}", "unexpected reference", 7),
        ("true false", "unexpected 'false'", 5),
        ("(1 + 2", "expected ')' to close the '(' at position 0, found end of expression", 6),
        ("(1 + 2]", "expected ')'", 6),
        ("1 + 2)", "unexpected ')'", 5),
        ("[1, 2", "expected ']' to close the '['", 5),
        ("[1, 2,]", "expected a value, found ']'", 6),
        ("[,]", "expected a value, found ','", 1),
        ("1 +", "expected a value, found end of expression", 3),
        ("* 2", "expected a value, found '*'", 0),
        ("+1", "expected a value, found '+'", 0),
        ("not", "expected a value, found end of expression", 3),
        ("1 and", "expected a value", 5),
        ("()", "expected a value, found ')'", 1),
        ("1 < 2 < 3", "comparisons cannot be chained; combine them with 'and'", 6),
        ("1 == 2 != 3", "comparisons cannot be chained", 7),
        ("'a' in ['a'] in [true]", "comparisons cannot be chained", 13),
        ("1 < 2 not in [3]", "comparisons cannot be chained", 6),
        ("1 not 2", "unexpected 'not'", 2),
        ("foo", "unknown name 'foo'; refer to values with ${...}", 0),
        ("${a} == bar", "unknown name 'bar'", 8),
        ("True", "unknown name 'True'; use 'true'", 0),
        ("False", "use 'false'", 0),
        ("None", "use 'null'", 0),
        ("AND", "use 'and'", 0),
        ("$a", "unexpected '$'; references are written ${...}", 0),
        ("${a", "unclosed '${'", 0),
        ("${}", "empty reference", 0),
        ("1 == ${a.}", "expected a name after '.'", 9),
        ("${a[x]}", "expected an integer index or a quoted key", 4),
        ("1.", "expected digits after the decimal point", 2),
        ("1.2.3", "invalid number", 0),
        (".5", "unexpected '.'", 0),
        ("1e5", "invalid number", 0),
        ("12abc", "invalid number", 0),
        ("0x1f", "invalid number", 0),
        ("1 ? 2 : 3", "unexpected character '?'", 2),
        ("a\u00e9", "unknown name 'a'", 0),
        ("\u00e9", "unexpected character", 0),
        ("\u0661", "unexpected character", 0),  # a non-ASCII digit is not a number
    ],
)
def test_syntax_errors_have_positions(source: str, message: str, position: int) -> None:
    error = parse_error(source)
    assert message in error.message
    assert error.position == position


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("__import__('os')", "unknown name '__import__'"),
        ("__import__('os').system('ls')", "unknown name '__import__'"),
        ("${a}.__class__", "attribute access is not supported"),
        ("'x'.upper()", "attribute access is not supported"),
        ("${a}(1)", "function calls are not supported"),
        ("(1)(2)", "function calls are not supported"),
        ("${a}[0]", "indexing is not supported"),
        ("[1][0]", "indexing is not supported"),
        ("1; 2", "unexpected character ';'"),
        ("1 == 1; import os", "unexpected character ';'"),
        ("lambda: 1", "unknown name 'lambda'"),
        ("open('/etc/passwd')", "unknown name 'open'"),
        ("[x for x in [1]]", "unknown name 'x'"),
        ("{'a': 1}", "unexpected character '{'"),
        ("2 ** 100", "expected a value, found '*'"),
        ("1 if true else 2", "unknown name 'if'"),
        ("a := 1", "unknown name 'a'"),
        ("`ls`", "unexpected character '`'"),
    ],
)
def test_python_constructs_are_rejected(source: str, message: str) -> None:
    assert message in parse_error(source).message


def test_length_limit() -> None:
    at_limit = "1" + " + 1" * ((MAX_LENGTH - 1) // 4)
    assert len(at_limit) <= MAX_LENGTH
    assert ev(at_limit) == (MAX_LENGTH - 1) // 4 + 1  # long flat chains are fine
    too_long = "1" + " " * MAX_LENGTH
    error = parse_error(too_long)
    assert error.message == f"expression is longer than {MAX_LENGTH} characters"
    assert error.position is None


@pytest.mark.parametrize(
    "template",
    [
        "(X)",
        "[X]",
        "-X",
        "not X",
        "(0 or 0 and 0 == 0 + 0 * X)",  # every precedence level inside each bracket
    ],
)
def test_nesting_limit(template: str) -> None:
    def nest(depth: int) -> str:
        source = "1"
        for _ in range(depth):
            source = template.replace("X", source)
        return source

    deepest = Expression.parse(nest(MAX_DEPTH))
    deepest.evaluate(resolve)  # parses and evaluates without recursion trouble
    error = parse_error(nest(MAX_DEPTH + 1))
    assert error.message == f"expression is nested too deeply (more than {MAX_DEPTH} levels)"
    assert error.position is not None


def test_nesting_limit_cannot_be_dodged_by_the_length_limit() -> None:
    source = "(" * 999 + "1" + ")" * 999
    assert len(source) <= MAX_LENGTH
    error = parse_error(source)
    assert "nested too deeply" in error.message
    assert error.position == MAX_DEPTH


# --- properties ------------------------------------------------------------------------

# Fragments that make plausible (and implausible) expressions when strung together.
_fragments = st.sampled_from(
    [
        "1", "2.5", "0", "'s'", '"t"', "true", "false", "null", "${a}", "${b.c[0]}",
        "${ok}", "(", ")", "[", "]", ",", "+", "-", "*", "/", "%", "==", "!=", "<", "<=",
        ">", ">=", "in", "not", "and", "or", " ", "=", "!", ".", "x", "'",
    ]
)  # fmt: skip
_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@given(fragments=st.lists(_fragments, max_size=25), values=st.lists(_values, min_size=3))
def test_only_expression_errors_escape(fragments: list[str], values: list[Any]) -> None:
    source = " ".join(fragments)
    try:
        expression = Expression.parse(source)
    except ExpressionError:
        return
    table = {"a": values[0], "b": {"c": [values[1]]}, "ok": values[2]}

    def lookup(ref: Reference) -> Any:
        return resolve_in(table, ref)

    try:
        result = expression.evaluate(lookup)
    except (ExpressionError, UnresolvedReference):
        return
    assert expression.truthy(lookup) is bool(result)


@given(st.text(max_size=80))
def test_parse_only_raises_expression_error(source: str) -> None:
    position: int | None = None
    try:
        Expression.parse(source)
    except ExpressionError as error:
        position = error.position
    assert position is None or 0 <= position <= len(source)


@given(a=st.integers(-(10**6), 10**6), b=st.integers(-(10**6), 10**6))
def test_integer_arithmetic_matches_python(a: int, b: int) -> None:
    assert ev(f"{a} + {b}") == a + b
    assert ev(f"{a} - {b}") == a - b
    assert ev(f"{a} * {b}") == a * b
    assert ev(f"{a} < {b}") is (a < b)
    assert ev(f"{a} == {b}") is (a == b)
    if b:
        assert ev(f"{a} % {b}") == a % b


def test_a_worker_parses_each_condition_once() -> None:
    source = "${variables.n} > 2 and ${variables.mode} == 'fast'"
    first = parsed(source)

    assert parsed(source) is first
    assert first == Expression.parse(source)
