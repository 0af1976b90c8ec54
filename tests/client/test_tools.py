"""``@tool`` and the test harness, in process: schemas from type hints, params converted
and refused as a worker would, outputs encoded, errors classified, the context."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

import jsonschema
import pydantic
import pytest

from orchestrator_client.tools import Cancelled, Context, ToolFailure, tool
from orchestrator_client.tools.harness import FakeContext, call


@dataclasses.dataclass
class Summary:
    """What a summary is.

    Attributes:
        text: the summary itself.
        words: how many words it kept.
    """

    text: str
    words: int = 0


class Options(TypedDict):
    """How to summarize.

    Attributes:
        tone: the summary's tone.
    """

    tone: Literal["plain", "bright"]
    bullets: NotRequired[bool]


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Item(pydantic.BaseModel):
    """A line of an order."""

    sku: str = pydantic.Field(description="the article")
    quantity: int = 1


@tool(name="acme.summarize", version="2", cost="0.02")
def summarize(
    ctx: Context, text: str, max_words: int = 3, options: Options | None = None
) -> Summary:
    """Summarize a text, keeping its first words.

    Args:
        text: what to summarize.
        max_words: at most this many words
            (the rest is dropped).
        options: how.
    """
    ctx.heartbeat({"words": len(text.split())})
    kept = text.split()[:max_words]
    return Summary(" ".join(kept), len(kept))


def test_the_params_schema_comes_from_the_annotations_defaults_and_docstring() -> None:
    schema = summarize.params_schema

    assert schema["properties"]["text"] == {"type": "string", "description": "what to summarize."}
    assert schema["properties"]["max_words"] == {
        "type": "integer",
        "description": "at most this many words (the rest is dropped).",
        "default": 3,
    }
    assert schema["required"] == ["text"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["options"]["anyOf"] == [
        {"$ref": "#/$defs/Options"},
        {"type": "null"},
    ]
    options = schema["$defs"]["Options"]
    assert options["required"] == ["tone"]
    assert options["properties"]["tone"] == {
        "enum": ["plain", "bright"],
        "description": "the summary's tone.",
    }
    jsonschema.Draft202012Validator.check_schema(schema)


def test_the_output_schema_describes_a_dataclass_with_its_field_docs() -> None:
    schema = summarize.output_schema

    assert schema["$ref"] == "#/$defs/Summary"
    summary = schema["$defs"]["Summary"]
    assert summary["description"] == "What a summary is."
    assert summary["properties"]["words"] == {
        "type": "integer",
        "description": "how many words it kept.",
        "default": 0,
    }
    jsonschema.Draft202012Validator.check_schema(schema)


def test_the_definition_holds_name_version_description_and_cost() -> None:
    definition = summarize.definition()

    assert definition["name"] == "acme.summarize"
    assert definition["version"] == "2"
    assert definition["description"] == "Summarize a text, keeping its first words."
    assert definition["cost"] == {"credits": "0.02"}


def test_a_pydantic_model_and_an_enum_are_described_and_converted() -> None:
    @tool(name="acme.order")
    def order(items: list[Item], colour: Colour = Colour.RED) -> list[Item]:
        return [item.model_copy(update={"sku": f"{item.sku}-{colour.value}"}) for item in items]

    assert order.params_schema["properties"]["colour"]["default"] == "red"
    assert order.params_schema["$defs"]["Item"]["properties"]["sku"]["description"] == (
        "the article"
    )
    outcome = call(order, {"items": [{"sku": "a"}], "colour": "blue"})

    assert outcome.output == [{"sku": "a-blue", "quantity": 1}]


def test_a_call_runs_the_tool_with_converted_params_and_encodes_its_output() -> None:
    context = FakeContext()

    outcome = call(
        summarize, {"text": "one two three four", "options": {"tone": "plain"}}, context=context
    )

    assert outcome.ok
    assert outcome.output == {"text": "one two three", "words": 3}
    assert outcome.cost == Decimal("0.02")
    assert context.progress == [{"words": 4}]


def test_an_async_tool_runs_through_the_harness_and_in_an_event_loop() -> None:
    @tool(name="acme.shout")
    async def shout(text: str) -> str:
        await asyncio.sleep(0)
        return text.upper()

    assert shout.is_async
    assert call(shout, {"text": "hi"}).output == "HI"
    assert asyncio.run(shout.arun({"text": "ho"}, FakeContext())).output == "HO"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "text: is required"),
        ({"text": 3}, "text: must be a string, got an integer"),
        ({"text": "a", "max_word": 2}, "max_word: is not a parameter"),
        ({"text": "a", "options": {"tone": "grey"}}, "options: must be one of"),
        ({"text": "a", "max_words": True}, "max_words: must be an integer, got a boolean"),
    ],
)
def test_params_that_do_not_fit_fail_with_invalid_input_naming_the_path(
    params: dict[str, object], message: str
) -> None:
    outcome = call(summarize, params)

    assert outcome.failure is not None
    assert outcome.failure.code == "invalid_input"
    assert outcome.failure.retryable is False
    assert message in outcome.failure.message


def test_an_output_that_is_not_json_fails_with_invalid_output() -> None:
    @tool(name="acme.odd")
    def odd() -> object:
        return object()

    outcome = call(odd)

    assert outcome.failure is not None
    assert outcome.failure.code == "invalid_output"


def test_declared_exceptions_classify_with_their_codes_and_retryability() -> None:
    @tool(name="acme.flaky", errors={TimeoutError: "timeout", KeyError: "not_found"})
    def flaky(kind: str) -> None:
        if kind == "timeout":
            raise TimeoutError("the service took too long")
        if kind == "missing":
            raise KeyError("sku")
        if kind == "refused":
            raise ToolFailure("permission_denied", "not yours")
        raise RuntimeError("boom")

    failures = {
        kind: call(flaky, {"kind": kind}).failure
        for kind in ("timeout", "missing", "refused", "crash")
    }

    assert {kind: (f.code, f.retryable) for kind, f in failures.items() if f} == {
        "timeout": ("timeout", True),
        "missing": ("not_found", False),
        "refused": ("permission_denied", False),
        "crash": ("tool_error", False),
    }
    assert failures["crash"] is not None
    assert failures["crash"].message == "RuntimeError: boom"


def test_a_computed_cost_is_read_from_the_output() -> None:
    @tool(name="acme.tokens", cost=lambda out: Decimal(out["tokens"]) / 1000)
    def tokens(n: int) -> dict[str, int]:
        return {"tokens": n}

    assert tokens.definition()["cost"] == {"computed": True}
    assert call(tokens, {"n": 1500}).cost == Decimal("1.5")


def test_a_stop_reaches_the_function_through_heartbeat_and_sleep() -> None:
    seen: list[str] = []

    @tool(name="acme.long")
    def long(ctx: Context, rounds: int) -> int:
        try:
            for n in range(rounds):
                ctx.heartbeat({"round": n})
                ctx.sleep(0.01)
        except Cancelled:
            seen.append("cancelled")
            raise
        return rounds

    context = FakeContext(cancel_after=3)
    outcome = call(long, {"rounds": 10}, context=context)

    assert outcome.failure is not None
    assert (outcome.failure.code, outcome.failure.retryable) == ("cancelled", False)
    assert seen == ["cancelled"]
    assert context.progress == [{"round": 0}, {"round": 1}, {"round": 2}]


def test_a_result_returned_after_a_stop_is_not_kept() -> None:
    @tool(name="acme.stubborn")
    def stubborn(ctx: Context) -> str:
        ctx.cancel()  # as a worker does when told to stop, while the tool goes on
        return "done anyway"

    outcome = call(stubborn)

    assert outcome.failure is not None
    assert outcome.failure.code == "cancelled"


def test_the_context_uploads_bytes_and_files_as_artifacts(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    report.write_bytes(b"file body")

    @tool(name="acme.report")
    def make(ctx: Context) -> list[str]:
        first = ctx.upload("a.txt", b"hello", "text/plain")
        second = ctx.upload("b.txt", report)
        return [first["name"], second["name"], str(second["size"])]

    context = FakeContext()
    outcome = call(make, context=context)

    assert outcome.output == ["a.txt", "b.txt", "9"]
    assert context.artifacts == {"a.txt": b"hello", "b.txt": b"file body"}


def test_the_context_tells_the_step_it_runs_for() -> None:
    @tool(name="acme.where")
    def where(ctx: Context) -> str:
        return f"{ctx.run_id}/{ctx.step_path}#{ctx.attempt}"

    context = FakeContext(run_id="r1", step_path="a.t.s", attempt=2)

    assert call(where, context=context).output == "r1/a.t.s#2"


@pytest.mark.parametrize(
    ("decorate", "message"),
    [
        (lambda: tool(name="Summarize")(lambda text: text), "dotted and lower case"),
        (lambda: tool(name="a.b", version="v 1")(lambda: None), "version"),
        (lambda: tool(name="a.b", errors={ValueError: "oops"})(lambda: None), "unknown code"),
        (lambda: tool(name="a.b", cost="-1")(lambda: None), "credits from 0"),
    ],
)
def test_a_bad_declaration_is_refused_when_decorating(
    decorate: Callable[[], object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        decorate()


def test_parameters_a_step_cannot_give_are_refused_when_decorating() -> None:
    def untyped(text):
        return text

    def starred(*texts: str) -> None:
        return None

    def late_context(text: str, ctx: Context) -> None:
        return None

    def demands(demands: dict[str, str]) -> None:
        return None

    cases: list[tuple[Callable[..., object], str]] = [
        (untyped, "has no type annotation"),
        (starred, "no \\*args"),
        (late_context, "Context parameter comes first"),
        (demands, "'demands' is the step's own"),
    ]
    for function, message in cases:
        with pytest.raises(TypeError, match=message):
            tool(name="a.b")(function)


def test_an_unknown_error_code_cannot_be_raised() -> None:
    with pytest.raises(ValueError, match="unknown error code"):
        ToolFailure("oops", "no such code")


def test_the_decorated_function_is_still_callable_as_written() -> None:
    assert summarize(FakeContext(), "a b c d", max_words=2) == Summary("a b", 2)
