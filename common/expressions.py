"""The `when` condition language: a tiny, safe expression language.

A step's `when` string, e.g. `${tasks.gather.status} == 'completed'`, decides whether the
step runs. Plans come from clients, so conditions are never handed to Python: they are
tokenised and parsed by hand (recursive descent) into a tree of small frozen dataclasses,
and evaluated by walking that tree. The only names are the keywords below; values come
from literals and from `${...}` references, which a caller-supplied resolver turns into
values. There is no attribute access, no calls and no indexing outside references, so
nothing a client writes can reach Python objects.

Grammar, lowest to highest precedence::

    expression := or_expr
    or_expr    := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | comparison
    comparison := additive (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not" "in")
                            additive)?
    additive   := term (("+" | "-") term)*
    term       := unary (("*" | "/" | "%") unary)*
    unary      := "-" unary | primary
    primary    := STRING | NUMBER | "true" | "false" | "null" | REFERENCE
                | "(" or_expr ")" | "[" [or_expr ("," or_expr)*] "]"

Comparisons do not chain (`a < b < c` is an error rather than Python's `a < b and b < c`,
which plan authors would not expect). Chains of `+`, `*`, `and` and `or` are stored as
flat n-ary nodes, so a long chain does not make a deep tree; together with the source
length limit and the nesting limit (brackets, lists, unary `-` and `not`) this bounds the
recursion of both parsing and evaluation.

Typing is strict and JSON-shaped: no coercion between strings and numbers, booleans are
not numbers, and every type error is an ExpressionError carrying the position of the
operator that failed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from common.templates import (
    Reference,
    TemplateError,
    UnresolvedReference,
    json_type_name,
    read_quoted,
    scan_reference,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "Expression",
    "ExpressionError",
    "UnresolvedReference",
]

MAX_LENGTH = 2000
MAX_DEPTH = 50

Resolver: TypeAlias = Callable[[Reference], Any]


class ExpressionError(ValueError):
    """A syntax error (at parse time) or type error (at evaluation time).

    `position` is an index into the expression source, or None when the error is about
    the expression as a whole (its length).
    """

    def __init__(self, message: str, position: int | None = None) -> None:
        self.message = message
        self.position = position
        super().__init__(message if position is None else f"{message} (at position {position})")

    def __reduce__(self) -> tuple[type[ExpressionError], tuple[str, int | None]]:
        # Keep message and position apart when pickled (e.g. in a Celery result).
        return (type(self), (self.message, self.position))


# ---------------------------------------------------------------------------------------
# Tokens

_KEYWORDS = frozenset({"and", "or", "not", "in", "true", "false", "null"})
_TWO_CHAR_OPERATORS = frozenset({"==", "!=", "<=", ">="})
_ONE_CHAR_OPERATORS = frozenset("()[],+-*/%<>")
_STRING_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t"}
_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in", "not in"})
# Characters people reach for from other languages, with what to write instead.
_HINTS = {
    "=": "use '==' to compare",
    "!": "use 'not' or '!='",
    "&": "use 'and'",
    "|": "use 'or'",
    ".": "attribute access is not supported; put the whole path inside ${...}",
    "$": "references are written ${...}",
}
_WORD_HINTS = {
    "True": "use 'true'",
    "False": "use 'false'",
    "None": "use 'null'",
    "nil": "use 'null'",
    "TRUE": "use 'true'",
    "FALSE": "use 'false'",
    "NULL": "use 'null'",
    "AND": "use 'and'",
    "OR": "use 'or'",
    "NOT": "use 'not'",
}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "string", "number", "ref", "keyword", "op" or "end"
    value: Any
    position: int

    def is_op(self, *operators: str) -> bool:
        return self.kind == "op" and self.value in operators

    def is_keyword(self, *keywords: str) -> bool:
        return self.kind == "keyword" and self.value in keywords

    def describe(self) -> str:
        if self.kind == "end":
            return "end of expression"
        if self.kind == "string":
            return f"string {self.value!r}"
        if self.kind == "number":
            return f"number {self.value}"
        if self.kind == "ref":
            return "reference"
        return repr(self.value)


def _is_word_start(c: str) -> bool:
    return c.isascii() and (c.isalpha() or c == "_")


def _is_word_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


def _read_number(source: str, start: int) -> tuple[int | float, int]:
    pos = start
    while pos < len(source) and source[pos].isascii() and source[pos].isdigit():
        pos += 1
    is_decimal = pos < len(source) and source[pos] == "."
    if is_decimal:
        pos += 1
        digits_start = pos
        while pos < len(source) and source[pos].isascii() and source[pos].isdigit():
            pos += 1
        if pos == digits_start:
            raise ExpressionError("expected digits after the decimal point", pos)
    if pos < len(source) and (_is_word_char(source[pos]) or source[pos] == "."):
        raise ExpressionError("invalid number", start)
    text = source[start:pos]
    if not is_decimal:
        return int(text), pos
    value = float(text)
    if not math.isfinite(value):
        raise ExpressionError("number is too large", start)
    return value, pos


def _tokenise(source: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(source):
        c = source[pos]
        if c.isspace():
            pos += 1
        elif source.startswith("${", pos):
            try:
                reference, end = scan_reference(source, pos)
            except TemplateError as error:
                raise ExpressionError(error.message, error.position) from None
            tokens.append(_Token("ref", reference, pos))
            pos = end
        elif c in "'\"":
            text, end = read_quoted(
                source, pos, _STRING_ESCAPES, ExpressionError,
                unterminated="unterminated string",
                unknown_escape="unknown escape in string (allowed: \\\\ \\' \\\" \\n \\t)",
            )  # fmt: skip
            tokens.append(_Token("string", text, pos))
            pos = end
        elif c.isascii() and c.isdigit():
            number, end = _read_number(source, pos)
            tokens.append(_Token("number", number, pos))
            pos = end
        elif _is_word_start(c):
            end = pos + 1
            while end < len(source) and _is_word_char(source[end]):
                end += 1
            word = source[pos:end]
            if word not in _KEYWORDS:
                hint = _WORD_HINTS.get(word, "refer to values with ${...}")
                raise ExpressionError(f"unknown name {word!r}; {hint}", pos)
            tokens.append(_Token("keyword", word, pos))
            pos = end
        elif source[pos : pos + 2] in _TWO_CHAR_OPERATORS:
            tokens.append(_Token("op", source[pos : pos + 2], pos))
            pos += 2
        elif c in _ONE_CHAR_OPERATORS:
            tokens.append(_Token("op", c, pos))
            pos += 1
        elif c in _HINTS:
            raise ExpressionError(f"unexpected {c!r}; {_HINTS[c]}", pos)
        else:
            raise ExpressionError(f"unexpected character {c!r}", pos)
    tokens.append(_Token("end", None, len(source)))
    return tokens


# ---------------------------------------------------------------------------------------
# Tree


@dataclass(frozen=True, slots=True)
class Literal:
    value: str | int | float | bool | None
    position: int


@dataclass(frozen=True, slots=True)
class Ref:
    reference: Reference
    position: int


@dataclass(frozen=True, slots=True)
class ListLiteral:
    items: tuple[Node, ...]
    position: int


@dataclass(frozen=True, slots=True)
class Negate:
    operand: Node
    position: int


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    position: int


@dataclass(frozen=True, slots=True)
class Arithmetic:
    """`first (op operand)*`, folded left to right; each op keeps its own position."""

    first: Node
    rest: tuple[tuple[str, int, Node], ...]


@dataclass(frozen=True, slots=True)
class Comparison:
    operator: str
    left: Node
    right: Node
    position: int


@dataclass(frozen=True, slots=True)
class Logical:
    """`operands[0] op operands[1] op ...` for one of `and` / `or`."""

    operator: str
    operands: tuple[Node, ...]


Node: TypeAlias = Literal | Ref | ListLiteral | Negate | Not | Arithmetic | Comparison | Logical


# ---------------------------------------------------------------------------------------
# Parser


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens
        self._index = 0
        self._depth = 0

    @property
    def _current(self) -> _Token:
        return self._tokens[self._index]

    def _advance(self) -> _Token:
        token = self._tokens[self._index]
        if token.kind != "end":
            self._index += 1
        return token

    def _enter(self, token: _Token) -> None:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ExpressionError(
                f"expression is nested too deeply (more than {MAX_DEPTH} levels)", token.position
            )

    def _leave(self) -> None:
        self._depth -= 1

    def parse(self) -> Node:
        if self._current.kind == "end":
            raise ExpressionError("empty expression", 0)
        node = self._or()
        token = self._current
        if token.kind != "end":
            if token.is_op("("):
                raise ExpressionError("function calls are not supported", token.position)
            if token.is_op("["):
                raise ExpressionError(
                    "indexing is not supported; put the whole path inside ${...}", token.position
                )
            raise ExpressionError(
                f"unexpected {token.describe()}; expected an operator or the end of the expression",
                token.position,
            )
        return node

    def _or(self) -> Node:
        operands = [self._and()]
        while self._current.is_keyword("or"):
            self._advance()
            operands.append(self._and())
        return operands[0] if len(operands) == 1 else Logical("or", tuple(operands))

    def _and(self) -> Node:
        operands = [self._not()]
        while self._current.is_keyword("and"):
            self._advance()
            operands.append(self._not())
        return operands[0] if len(operands) == 1 else Logical("and", tuple(operands))

    def _not(self) -> Node:
        token = self._current
        if not token.is_keyword("not"):
            return self._comparison()
        self._advance()
        self._enter(token)
        operand = self._not()
        self._leave()
        return Not(operand, token.position)

    def _comparison_operator(self) -> str | None:
        token = self._current
        if token.kind == "op" and token.value in _COMPARISONS:
            return str(token.value)
        if token.is_keyword("in"):
            return "in"
        if token.is_keyword("not") and self._tokens[self._index + 1].is_keyword("in"):
            return "not in"
        return None

    def _comparison(self) -> Node:
        left = self._additive()
        operator = self._comparison_operator()
        if operator is None:
            return left
        position = self._current.position
        self._advance()
        if operator == "not in":
            self._advance()
        right = self._additive()
        if self._comparison_operator() is not None:
            raise ExpressionError(
                "comparisons cannot be chained; combine them with 'and'", self._current.position
            )
        return Comparison(operator, left, right, position)

    def _additive(self) -> Node:
        first = self._term()
        rest: list[tuple[str, int, Node]] = []
        while self._current.is_op("+", "-"):
            token = self._advance()
            rest.append((token.value, token.position, self._term()))
        return Arithmetic(first, tuple(rest)) if rest else first

    def _term(self) -> Node:
        first = self._unary()
        rest: list[tuple[str, int, Node]] = []
        while self._current.is_op("*", "/", "%"):
            token = self._advance()
            rest.append((token.value, token.position, self._unary()))
        return Arithmetic(first, tuple(rest)) if rest else first

    def _unary(self) -> Node:
        token = self._current
        if not token.is_op("-"):
            return self._primary()
        self._advance()
        self._enter(token)
        operand = self._unary()
        self._leave()
        return Negate(operand, token.position)

    def _primary(self) -> Node:
        token = self._advance()
        if token.kind in ("string", "number"):
            return Literal(token.value, token.position)
        if token.kind == "ref":
            return Ref(token.value, token.position)
        if token.is_keyword("true", "false", "null"):
            constants = {"true": True, "false": False, "null": None}
            return Literal(constants[token.value], token.position)
        if token.is_op("("):
            self._enter(token)
            node = self._or()
            self._expect(")", token)
            self._leave()
            return node
        if token.is_op("["):
            self._enter(token)
            items: list[Node] = []
            if not self._current.is_op("]"):
                items.append(self._or())
                while self._current.is_op(","):
                    self._advance()
                    items.append(self._or())
            self._expect("]", token)
            self._leave()
            return ListLiteral(tuple(items), token.position)
        raise ExpressionError(f"expected a value, found {token.describe()}", token.position)

    def _expect(self, closing: str, opening: _Token) -> None:
        token = self._current
        if not token.is_op(closing):
            raise ExpressionError(
                f"expected {closing!r} to close the {opening.value!r} at position"
                f" {opening.position}, found {token.describe()}",
                token.position,
            )
        self._advance()


# ---------------------------------------------------------------------------------------
# Evaluation


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(left: Any, right: Any) -> bool:
    """JSON equality: numbers compare by value (1 == 1.0), nothing else is coerced."""
    if _is_number(left) and _is_number(right):
        return bool(left == right)
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    if isinstance(left, str) or isinstance(right, str):
        return isinstance(left, str) and isinstance(right, str) and left == right
    if left is None or right is None:
        return left is right
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(map(_equal, left, right))
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(_equal(left[k], right[k]) for k in left)
    return False


def _a(value: Any) -> str:
    name = json_type_name(value)
    if name == "null":
        return name
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _check_finite(value: int | float, position: int) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError("numeric result is out of range", position)
    return value


def _arithmetic(operator: str, left: Any, right: Any, position: int) -> Any:
    if operator == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    if not (_is_number(left) and _is_number(right)):
        what = "numbers or two strings" if operator == "+" else "numbers"
        raise ExpressionError(
            f"{operator!r} needs {what}, not {_a(left)} and {_a(right)}", position
        )
    if operator in ("/", "%") and right == 0:
        raise ExpressionError("division by zero", position)
    try:
        if operator == "+":
            result = left + right
        elif operator == "-":
            result = left - right
        elif operator == "*":
            result = left * right
        elif operator == "/":
            result = left / right
        else:
            result = left % right
    except ArithmeticError as error:  # OverflowError: int too large to convert to float
        raise ExpressionError(f"arithmetic error: {error}", position) from None
    return _check_finite(result, position)


def _compare(operator: str, left: Any, right: Any, position: int) -> bool:
    if operator in ("==", "!="):
        try:
            same = _equal(left, right)
        except RecursionError:
            raise ExpressionError("values are nested too deeply to compare", position) from None
        return same if operator == "==" else not same
    if operator in ("in", "not in"):
        found = _contains(right, left, operator, position)
        return found if operator == "in" else not found
    both_numbers = _is_number(left) and _is_number(right)
    both_strings = isinstance(left, str) and isinstance(right, str)
    if not (both_numbers or both_strings):
        raise ExpressionError(
            f"{operator!r} needs two numbers or two strings, not {_a(left)} and {_a(right)}",
            position,
        )
    if operator == "<":
        return bool(left < right)
    if operator == "<=":
        return bool(left <= right)
    if operator == ">":
        return bool(left > right)
    return bool(left >= right)


def _contains(container: Any, item: Any, operator: str, position: int) -> bool:
    if isinstance(container, str):
        if not isinstance(item, str):
            raise ExpressionError(
                f"{operator!r} with a string on the right needs a string on the left,"
                f" not {_a(item)}",
                position,
            )
        return item in container
    if isinstance(container, list | tuple | Mapping):
        # A Mapping iterates over its keys: `'x' in ${obj}` asks whether the key exists.
        try:
            return any(_equal(item, element) for element in container)
        except RecursionError:
            raise ExpressionError("values are nested too deeply to compare", position) from None
    raise ExpressionError(
        f"{operator!r} needs a list, string or object on the right, not {_a(container)}",
        position,
    )


def _evaluate(node: Node, resolve: Resolver) -> Any:
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, Ref):
        return resolve(node.reference)
    if isinstance(node, ListLiteral):
        return [_evaluate(item, resolve) for item in node.items]
    if isinstance(node, Not):
        return not _evaluate(node.operand, resolve)
    if isinstance(node, Negate):
        value = _evaluate(node.operand, resolve)
        if not _is_number(value):
            raise ExpressionError(f"unary '-' needs a number, not {_a(value)}", node.position)
        return -value
    if isinstance(node, Arithmetic):
        result = _evaluate(node.first, resolve)
        for operator, position, operand in node.rest:
            result = _arithmetic(operator, result, _evaluate(operand, resolve), position)
        return result
    if isinstance(node, Comparison):
        left = _evaluate(node.left, resolve)
        right = _evaluate(node.right, resolve)
        return _compare(node.operator, left, right, node.position)
    # Logical: stop at the first operand that decides the result, so references in the
    # rest are never resolved (`${a} != null and ${a.b} == 1` is safe).
    deciding = node.operator == "or"
    for operand in node.operands:
        if bool(_evaluate(operand, resolve)) is deciding:
            return deciding
    return not deciding


class Expression:
    """A parsed `when` condition. Parse once (validating the plan), evaluate per run."""

    __slots__ = ("_references", "source", "tree")

    def __init__(self, source: str, tree: Node, references: tuple[Reference, ...]) -> None:
        self.source = source
        self.tree = tree
        self._references = references

    @classmethod
    def parse(cls, source: str) -> Expression:
        if len(source) > MAX_LENGTH:
            raise ExpressionError(f"expression is longer than {MAX_LENGTH} characters")
        tokens = _tokenise(source)
        tree = _Parser(tokens).parse()
        references = tuple(token.value for token in tokens if token.kind == "ref")
        return cls(source, tree, references)

    @property
    def references(self) -> list[Reference]:
        """Every `${...}` in source order (repeats included)."""
        return list(self._references)

    def evaluate(self, resolve: Resolver) -> Any:
        """The expression's value. Raises ExpressionError for type errors; exceptions from
        `resolve` (normally UnresolvedReference) propagate unchanged."""
        return _evaluate(self.tree, resolve)

    def truthy(self, resolve: Resolver) -> bool:
        """Whether the step should run: Python truthiness of the value."""
        return bool(self.evaluate(resolve))

    def __eq__(self, other: object) -> bool:
        # Parsing is deterministic, so the source identifies the expression.
        return isinstance(other, Expression) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


@functools.lru_cache(maxsize=4096)
def parsed(source: str) -> Expression:
    """``Expression.parse``, remembered per process: a worker evaluates the same few
    conditions on every attempt of every step that carries them. Parsing is deterministic
    and an Expression is never changed, so sharing one is safe; errors are not cached."""
    return Expression.parse(source)
