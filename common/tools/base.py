"""What a tool is: a function of (params, context) returning a result or raising ToolError.

Tools run in a worker process outside any database transaction. They return their
output (JSON-serialisable) and, optionally, their cost in credits (otherwise the tool's
price from settings is charged). Failures raise ``ToolError`` with a code from
``common.errors``; the code decides whether the engine retries.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, BinaryIO

from common.errors import is_retryable
from common.templates import format_reference, secret_references

# How often a long tool looks for cancellation (a cooperative check; revoke with
# terminate is the other half).
CANCEL_CHECK_INTERVAL = 0.25


@dataclass
class ToolResult:
    output: Any = None
    cost: Decimal | None = None
    # Set by a tool that hands its work to the outside (a runner job): the step goes on
    # RUNNING without a worker until that ends (runs.engine.waiting). Nothing is charged
    # now; the attempt is charged when it ends.
    wait: dict[str, Any] | None = None


class ToolError(Exception):
    def __init__(self, code: str, message: str, retryable: bool | None = None) -> None:
        self.code = code
        self.message = message
        self.retryable = is_retryable(code) if retryable is None else retryable
        super().__init__(f"{code}: {message}")

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


def _no_artifacts(name: str, stream: BinaryIO, size: int, content_type: str) -> dict[str, Any]:
    raise ToolError("tool_error", "this step cannot save artifacts", False)


def _no_callback(seconds: float) -> dict[str, str]:
    raise ToolError("tool_error", "only a callback step opens a callback URL", False)


@dataclass
class ToolContext:
    step_id: int
    run_id: str
    attempt: int
    timeout_s: float | None
    # Returns True once the step should stop (cancelled, or no longer ours).
    stop_requested: Callable[[], bool] = field(default=lambda: False)
    # The `callback` tool's: opens this attempt's callback URL (the executor gave it to
    # the templates as ${callback.url}) to expire in so many seconds; returns its wait
    # id and URL ({"wait", "url"}).
    open_callback: Callable[[float], dict[str, str]] = field(default=_no_callback)
    # Saves ``size`` bytes read from a stream as an artifact of the run, made by this
    # step (docs/artifacts.md); returns its ``{id, name, size, sha256, content_type}``.
    # The step's output lists the artifacts it saved.
    save_artifact: Callable[[str, BinaryIO, int, str], dict[str, Any]] = field(
        default=_no_artifacts
    )
    # Keeps what the tool says of how far it got (any JSON), on the step's row with the
    # next lease renewal (orchestrator.lease_keeper): a client reads it with the step.
    progress: Callable[[Any], None] = field(default=lambda progress: None)

    def save_bytes(self, name: str, data: bytes, content_type: str = "") -> dict[str, Any]:
        """Save ``data`` as the artifact ``name``."""
        return self.save_artifact(name, io.BytesIO(data), len(data), content_type)

    def save_file(self, name: str, path: str, content_type: str = "") -> dict[str, Any]:
        """Save the file at ``path`` as the artifact ``name`` (streamed, not read whole)."""
        with open(path, "rb") as stream:
            return self.save_artifact(name, stream, os.fstat(stream.fileno()).st_size, content_type)

    def sleep(self, seconds: float) -> None:
        """Sleep in short slices, stopping with ToolError('cancelled') when asked to."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, CANCEL_CHECK_INTERVAL))
            # After the last slice the step is over: a cancel that came meanwhile drops
            # its result when it is recorded, without a query here.
            if deadline > time.monotonic() and self.stop_requested():
                raise ToolError("cancelled", "the step was cancelled while running", False)


Tool = Callable[[dict[str, Any], ToolContext], ToolResult]
ParamValidator = Callable[[dict[str, Any]], list[tuple[str, str]]]


# The parameters of a step that the engine hands to its tool as written: neither
# rendered as templates nor checked against the plan's scope (a child run's own plan, a
# poll's conditions on the response). The tool's validator checks them.
VerbatimParams = Callable[[dict[str, Any]], frozenset[str]]


def no_verbatim(params: dict[str, Any]) -> frozenset[str]:
    return frozenset()


# The parameters of a step whose rendered values the engine keeps or shows (a runner
# job's prompt, a poll's URL and headers, a child run's variables, a wait's time): they
# may not read a secret, which would be kept in clear (``common.templates.
# secret_references`` decides, at submission and again before they are rendered).
StoredParams = Callable[[dict[str, Any]], frozenset[str]]


def nothing_stored(params: dict[str, Any]) -> frozenset[str]:
    return frozenset()


def all_stored(params: dict[str, Any]) -> frozenset[str]:
    return frozenset(params)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    run: Tool | None  # None for tools a worker never executes (approval)
    validate: ParamValidator | None = None
    verbatim: VerbatimParams = no_verbatim
    stored: StoredParams = nothing_stored

    def secret_kept(self, written: dict[str, Any], rendered: dict[str, Any]) -> str:
        """Why a step's parameters cannot be handed to this tool ("": they can): one it
        keeps reads a secret as written (the plan checks refuse it; a plan stored before
        they did), or holds a reference to one once rendered (a value rendered from a
        variable or an output is data, and a child run would read one in its plan)."""
        stored = self.stored(written)
        for given, how in ((written, "reads"), (rendered, "renders to text holding")):
            kept = {key: value for key, value in given.items() if key in stored}
            found = secret_references(kept, "params")
            if found:
                where, ref = found[0]
                return (
                    f"{where} {how} ${{{format_reference(ref)}}}: the {self.name} tool keeps "
                    "it as rendered, so it cannot hold a secret"
                )
        return ""


def has_template(value: Any) -> bool:
    return isinstance(value, str) and "${" in value
