"""`make profile-api`'s instrumented pass: an API request's time split into layers.

Each layer's entry points (LAYERS says which) are wrapped with a timer on a stack, the
``Ledger``: the time between two clock readings goes to the layer on top, so each
layer's figure excludes the layers entered inside it and the layers add up to the
request. SQL statements (COMMITs and the pool's check of a connection included), the
time the ORM spends writing their SQL (``SQLCompiler.as_sql``) and Redis round trips are
counted by the layer that sent them. ``instrumented`` installs every wrapper and puts
everything back on the way out.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import types
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bench.profile import _kind as statement_kind

# The layers, in the table's order: (name, column, what is charged to it).
LAYERS: tuple[tuple[str, str, str], ...] = (
    ("auth", "auth", "API key authentication and its lookup, the scope check "
     "(api.authentication, api.permissions; DRF's _authenticate, check_permissions)"),
    ("throttle", "thrtl", "the rate limit, a GCRA script in Redis (api.throttling; DRF's "
     "check_throttles)"),
    ("idempotency", "idem", "the Idempotency-Key's claim, fingerprint, stored response and "
     "completion (api.idempotency's functions)"),
    ("validation", "valid", "query and body: parsing and input serializers (api.query_parameters, "
     "api.parsers, api.base.validated; DRF's Request._parse)"),
    ("services", "svc", "services and selectors (runs.services, runs.selectors, "
     "runs.people.approvals, billing.selectors, billing.secrets, api.pagination's page queries), "
     "the view's transaction and its after-commit work"),
    ("serializers", "ser", "output serializers and JSON rendering (api.serializers through "
     "DRF's Serializer.data, Response.rendered_content, JSONRenderer)"),
    ("logcontext", "logc", "common.logcontext's bound and add (ApiView.dispatch, initial)"),
    ("metrics", "metr", "the request counter (api.metrics -> common.metrics.api_request)"),
    ("connection", "conn", "the database connection taken from the pool and given back, "
     "once per request (Django's connect, close, close_if_unusable_or_obsolete)"),
    ("drf", "drf", "the rest of DRF's dispatch (Request, negotiation, finalize_response) and "
     "the views' own lines"),
    ("django", "djng", "the rest: WSGI handler, middleware, URL resolving, signals"),
)  # fmt: skip
LAYER_NAMES = tuple(name for name, _, _ in LAYERS)
# A layer entered inside one of these stays charged to it: the key lookup's ORM is auth's,
# the stored response's JSON rendering idempotency's. The connection is the exception:
# whoever asks first for the request's connection, taking it from the pool is its own.
STICKY = frozenset({"auth", "throttle", "idempotency", "logcontext", "metrics"})


@dataclass
class Tally:
    seconds: float = 0.0
    statements: int = 0
    sql_seconds: float = 0.0
    redis: int = 0
    redis_seconds: float = 0.0
    compile_seconds: float = 0.0


class Ledger:
    """Charges the time between two clock readings to the layer on top of the stack, so
    that each layer's time excludes the layers entered inside it."""

    def __init__(self) -> None:
        self.tallies = {name: Tally() for name in LAYER_NAMES}
        self.kinds: Counter[str] = Counter()
        self.kind_seconds: defaultdict[str, float] = defaultdict(float)
        self.stack: list[str] = []
        self.last = 0.0
        self.compiling = 0  # depth of SQLCompiler.as_sql calls (subqueries nest)

    @property
    def top(self) -> str:
        return self.stack[-1] if self.stack else "django"

    def enter(self, layer: str, force: bool = False) -> bool:
        """Put ``layer`` on top; False when it stays with the one there (the same layer,
        or a sticky one), and the caller must not ``leave``."""
        top = self.stack[-1] if self.stack else None
        if top == layer or (top in STICKY and not force):
            return False
        now = time.perf_counter()
        if top is not None:
            self.tallies[top].seconds += now - self.last
        self.last = now
        self.stack.append(layer)
        return True

    def leave(self) -> None:
        now = time.perf_counter()
        self.tallies[self.stack.pop()].seconds += now - self.last
        self.last = now

    def statement(self, kind: str, seconds: float) -> None:
        tally = self.tallies[self.top]
        tally.statements += 1
        tally.sql_seconds += seconds
        self.kinds[kind] += 1
        self.kind_seconds[kind] += seconds

    def redis(self, kind: str, seconds: float) -> None:
        tally = self.tallies[self.top]
        tally.redis += 1
        tally.redis_seconds += seconds
        self.kinds[f"redis {kind}"] += 1
        self.kind_seconds[f"redis {kind}"] += seconds


def _compiling(ledger: Ledger, function: Any) -> Any:
    """``SQLCompiler.as_sql``: the time the ORM spends writing SQL, outermost call only."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ledger.compiling += 1
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            ledger.compiling -= 1
            if not ledger.compiling:
                ledger.tallies[ledger.top].compile_seconds += time.perf_counter() - started

    return wrapper


def timed(ledger: Ledger, layer: str, function: Any, force: bool = False) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not ledger.enter(layer, force):
            return function(*args, **kwargs)
        try:
            return function(*args, **kwargs)
        finally:
            ledger.leave()

    return wrapper


class TimedContext:
    """A context manager whose entering and leaving are charged to ``layer``."""

    def __init__(self, ledger: Ledger, layer: str, inner: Any) -> None:
        self.ledger, self.layer, self.inner = ledger, layer, inner

    def __enter__(self) -> Any:
        pushed = self.ledger.enter(self.layer)
        try:
            return self.inner.__enter__()
        finally:
            if pushed:
                self.ledger.leave()

    def __exit__(self, *exc: Any) -> Any:
        pushed = self.ledger.enter(self.layer)
        try:
            return self.inner.__exit__(*exc)
        finally:
            if pushed:
                self.ledger.leave()


class TimedTransactions:
    """``django.db.transaction`` for a module whose own ``atomic`` blocks belong to the
    services: the block the idempotency wrapper opens around the view commits what the
    services wrote (without a key, their own block would); inside the claim it stays
    idempotency's (sticky)."""

    def __init__(self, ledger: Ledger, transaction: Any) -> None:
        self._ledger, self._transaction = ledger, transaction

    def atomic(self, *args: Any, **kwargs: Any) -> TimedContext:
        return TimedContext(self._ledger, "services", self._transaction.atomic(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transaction, name)


class Patches:
    """Attributes replaced for the instrumented pass, put back by ``undo``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.undo_list: list[Callable[[], None]] = []
        self.wrapped: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, wrapper)

    def replace(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner)
        original = vars(owner).get(name)
        setattr(owner, name, value)

        def undo() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self.undo_list.append(undo)

    def method(self, owner: Any, name: str, layer: str, force: bool = False) -> None:
        original = getattr(owner, name)
        wrapper = timed(self.ledger, layer, original, force)
        self.wrapped[id(original)] = (original, wrapper)
        self.replace(owner, name, wrapper)

    def prop(self, owner: type, name: str, layer: str) -> None:
        original = vars(owner)[name]
        assert isinstance(original, property), f"{owner.__name__}.{name} is not a property"
        self.replace(owner, name, property(timed(self.ledger, layer, original.fget)))

    def module(self, module: types.ModuleType, layer: str, names: tuple[str, ...] = ()) -> None:
        """Every function ``module`` defines (or those ``names``)."""
        for name, value in list(vars(module).items()):
            if names and name not in names:
                continue
            if inspect.isfunction(value) and value.__module__ == module.__name__:
                self.method(module, name, layer)

    def rebind(self, prefixes: tuple[str, ...]) -> None:
        """Where a module imported a wrapped function by name, call the wrapper instead."""
        for module_name, module in list(sys.modules.items()):
            if module is None or not module_name.startswith(prefixes):
                continue
            for name, value in list(vars(module).items()):
                found = self.wrapped.get(id(value))
                if found is not None and found[0] is value:
                    self.replace(module, name, found[1])

    def undo(self) -> None:
        for undo in reversed(self.undo_list):
            undo()
        self.undo_list.clear()


@contextmanager
def instrumented(ledger: Ledger) -> Iterator[None]:
    """Every layer's entry points timed on ``ledger``; SQL and Redis counted. Everything
    replaced is put back on the way out, whatever happens."""
    from django.db import connection

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            ledger.statement(statement_kind(sql), time.perf_counter() - started)

    patches = Patches(ledger)
    try:
        _install(patches)
        with connection.execute_wrapper(capture):
            yield
    finally:
        patches.undo()


def _install(patches: Patches) -> None:
    """Wrap each layer's entry points (LAYERS says which), and count COMMITs, the pool's
    checks, Redis round trips and the ORM's time writing SQL."""
    import psycopg
    import redis
    from django.db import connection, connections, transaction
    from django.db.models.sql import compiler as sql_compiler
    from rest_framework import serializers
    from rest_framework.permissions import IsAuthenticated
    from rest_framework.renderers import JSONRenderer
    from rest_framework.request import Request
    from rest_framework.response import Response
    from rest_framework.views import APIView

    import api.base
    import api.idempotency
    import api.pagination
    import api.parsers
    import api.query_parameters
    import api.runs
    import api.serializers
    import billing.secrets
    import billing.selectors
    import common.logcontext
    import common.metrics
    import runs.people.approvals
    import runs.selectors
    import runs.services
    from api.authentication import ApiKeyAuthentication
    from api.permissions import ScopePermission
    from api.throttling import ApiKeyRateThrottle

    ledger = patches.ledger
    # auth, throttle
    patches.method(ApiKeyAuthentication, "authenticate", "auth")
    patches.method(ScopePermission, "has_permission", "auth")
    patches.method(IsAuthenticated, "has_permission", "auth")
    patches.method(Request, "_authenticate", "auth")
    patches.method(APIView, "check_permissions", "auth")
    patches.method(ApiKeyRateThrottle, "allow_request", "throttle")
    patches.method(APIView, "check_throttles", "throttle")
    # idempotency: the functions its view wrapper calls by name
    patches.module(
        api.idempotency,
        "idempotency",
        names=(
            "validate_key",
            "fingerprint",
            "idempotency_claim",
            "idempotency_complete",
            "idempotency_release",
            "replay",
            "_storable",
        ),
    )
    patches.replace(api.idempotency, "transaction", TimedTransactions(ledger, transaction))
    patches.replace(api.runs, "transaction", TimedTransactions(ledger, transaction))
    # validation
    patches.method(Request, "_parse", "validation")
    patches.module(api.query_parameters, "validation", names=("checked_query",))
    patches.module(api.parsers, "validation", names=("refuse_if_too_large", "plan_size_hint"))
    patches.module(api.base, "validation", names=("validated",))
    # services and selectors
    for module in (
        runs.services,
        runs.selectors,
        runs.people.approvals,
        billing.selectors,
        billing.secrets,
    ):
        patches.module(module, "services")
    patches.module(
        api.pagination, "services", names=("paginate", "paginate_by_id", "paginate_counted")
    )
    # serializers and rendering
    for owner in (serializers.BaseSerializer, serializers.Serializer, serializers.ListSerializer):
        patches.prop(owner, "data", "serializers")
    patches.prop(Response, "rendered_content", "serializers")
    # Rows written the short way (api.serializers.FastOutput's class methods).
    for name in ("row", "rows"):
        function = vars(api.serializers.FastOutput)[name].__func__
        wrapper: classmethod[Any, Any, Any] = classmethod(
            timed(patches.ledger, "serializers", function)
        )
        patches.replace(api.serializers.FastOutput, name, wrapper)
    patches.module(api.base, "serializers", names=("written",))
    patches.method(JSONRenderer, "render", "serializers")
    # log context, metrics
    bound = common.logcontext.bound

    def bound_timed(**fields: Any) -> TimedContext:
        return TimedContext(ledger, "logcontext", bound(**fields))

    patches.replace(common.logcontext, "bound", bound_timed)
    patches.method(common.logcontext, "add", "logcontext")
    patches.method(common.metrics, "api_request", "metrics")
    # DRF's dispatch
    patches.method(api.base.ApiView, "dispatch", "drf")
    patches.method(APIView, "dispatch", "drf")
    # the connection, its commits and after-commit work
    wrapper_class = type(connections[connection.alias])
    for name in ("connect", "close", "close_if_unusable_or_obsolete"):
        patches.method(wrapper_class, name, "connection", force=True)
    patches.method(wrapper_class, "run_and_clear_commit_hooks", "services")
    for name, kind in (("_commit", "COMMIT"), ("_rollback", "ROLLBACK")):
        patches.replace(wrapper_class, name, _counted(ledger, getattr(wrapper_class, name), kind))
    # Redis round trips: commands, and pipelines sent at once
    patches.replace(
        redis.Redis, "execute_command", _redis_counted(ledger, redis.Redis.execute_command, None)
    )
    pipeline = redis.client.Pipeline
    patches.replace(pipeline, "execute", _redis_counted(ledger, pipeline.execute, "PIPELINE"))
    # The pool checks each connection it hands out with an empty statement on the
    # psycopg connection itself, which Django's execute wrappers never see.
    patches.replace(
        psycopg.Connection,
        "execute",
        _counted(ledger, psycopg.Connection.execute, "(the pool's check of a connection)"),
    )
    patches.rebind(("api.",))
    for compiler in (
        sql_compiler.SQLCompiler,
        sql_compiler.SQLInsertCompiler,
        sql_compiler.SQLDeleteCompiler,
        sql_compiler.SQLUpdateCompiler,
        sql_compiler.SQLAggregateCompiler,
    ):
        patches.replace(compiler, "as_sql", _compiling(ledger, vars(compiler)["as_sql"]))


def _counted(ledger: Ledger, function: Any, kind: str) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            ledger.statement(kind, time.perf_counter() - started)

    return wrapper


def _redis_counted(ledger: Ledger, function: Any, kind: str | None) -> Any:
    @functools.wraps(function)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(self, *args, **kwargs)
        finally:
            name = kind or (str(args[0]).upper() if args else "?")
            ledger.redis(name, time.perf_counter() - started)

    return wrapper
