"""`python -m bench.profile_api`: where an API request's time goes, layer by layer.

Sets up an organization with an API key, a secret and runs in several states (created,
running, completed with outputs), then sends each route ``--requests`` times (300)
through the whole Django stack in this process: a WSGI call of Django's own handler with
every middleware, the real `Authorization: Bearer` key, the real throttle against Redis,
an `Idempotency-Key` on every POST, and the database connection borrowed from a pool and
returned after each request, as the web process does (config/gunicorn.py). Nothing is
mocked: the layers are only timed.

Each route is sent three ways: plain (the time per request reported), instrumented (the
time split into layers) and, for ``--route``, under cProfile (``--top`` functions). The
instrumented pass wraps each layer's entry points with a timer on a stack: the time
between two clock readings goes to the layer on top, so each layer's figure excludes the
layers entered inside it and the layers add up to the request. SQL statements (COMMITs
and the pool's check of a connection included), the time the ORM spends writing their
SQL (``SQLCompiler.as_sql``) and Redis round trips are counted by the layer that sent
them, and their time is part of that layer's. See LAYERS for what each layer holds.

The throttle's rate is raised so that nothing is refused (its Redis script runs as
ever), and the organization's run limits so that every start is admitted at once.
Expects migrated PostgreSQL at DATABASE_URL and Redis at CELERY_BROKER_URL:
``scripts/bench.sh profile-api`` (``make profile-api``) starts throwaway ones.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import inspect
import io
import json
import os
import pstats
import statistics
import sys
import sysconfig
import time
import types
import uuid
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
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
    ("validation", "valid", "query and body: parsing and input serializers (api.query, "
     "api.parsers, api.views.validated; DRF's Request._parse)"),
    ("services", "svc", "services and selectors (runs.services, runs.selectors, "
     "runs.approvals, billing.selectors, billing.secrets, api.pagination's page queries), "
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

FLOOR_PATH = "/api/v1/_profile/floor"
THROTTLE_RATE = "100000000/min"  # nothing refused; the script's round trip is the same

# A run's plan as a client sends it: two tasks of three steps, variables and a template.
PLAN: dict[str, Any] = {
    "name": "profile-api",
    "variables": {"topic": "AI chips"},
    "agents": [
        {
            "name": "researcher",
            "tasks": [
                {
                    "name": name,
                    "steps": [
                        {"name": "search", "tool": "echo", "params": {"q": "${variables.topic}"}},
                        {"name": "read", "tool": "echo", "params": {"n": 3}},
                        {"name": "summarise", "tool": "noop"},
                    ],
                }
                for name in ("gather", "write")
            ],
        }
    ],
}
DETAIL_STEPS = 20  # the completed run read by run, steps and events: 20 steps with outputs


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    path: str  # {run} is a run id: the detail run's, or a fresh one (``consumes``)
    query: str = ""
    body: dict[str, Any] | None = None
    consumes: str = ""  # "created" or "running": each request gets a run of its own

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}" + (f"?{self.query}" if self.query else "")


ROUTES: tuple[Route, ...] = (
    Route("floor", "GET", FLOOR_PATH),
    Route("run", "GET", "/api/v1/runs/{run}"),
    Route("runs_running", "GET", "/api/v1/runs", query="status=running"),
    Route("steps", "GET", "/api/v1/runs/{run}/steps"),
    Route("events", "GET", "/api/v1/runs/{run}/events"),
    Route("balance", "GET", "/api/v1/billing/balance"),
    Route("create", "POST", "/api/v1/runs", body={"plan": PLAN, "start": False}),
    Route("start", "POST", "/api/v1/runs/{run}/start", body={}, consumes="created"),
    Route("cancel", "POST", "/api/v1/runs/{run}/cancel", body={"reason": "profile"},
          consumes="running"),
)  # fmt: skip
ROUTE_NAMES = tuple(route.name for route in ROUTES)


# --------------------------------------------------------------------------- the ledger
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

    import api.idempotency
    import api.pagination
    import api.parsers
    import api.query
    import api.serializers
    import api.views
    import billing.secrets
    import billing.selectors
    import common.logcontext
    import common.metrics
    import runs.approvals
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
    patches.replace(api.views, "transaction", TimedTransactions(ledger, transaction))
    # validation
    patches.method(Request, "_parse", "validation")
    patches.module(api.query, "validation", names=("checked_query",))
    patches.module(api.parsers, "validation", names=("refuse_if_too_large", "plan_size_hint"))
    patches.module(api.views, "validation", names=("validated",))
    # services and selectors
    for module in (
        runs.services,
        runs.selectors,
        runs.approvals,
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
    patches.module(api.views, "serializers", names=("written",))
    patches.method(JSONRenderer, "render", "serializers")
    # log context, metrics
    bound = common.logcontext.bound

    def bound_timed(**fields: Any) -> TimedContext:
        return TimedContext(ledger, "logcontext", bound(**fields))

    patches.replace(common.logcontext, "bound", bound_timed)
    patches.method(common.logcontext, "add", "logcontext")
    patches.method(common.metrics, "api_request", "metrics")
    # DRF's dispatch
    patches.method(api.views.ApiView, "dispatch", "drf")
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


# --------------------------------------------------------------------------- the floor
def urlconf() -> types.ModuleType:
    """The project's URLs, and before them a trivial authenticated view: an ``ApiView``
    (authentication, permissions, throttling, log context, query check) answering a
    constant. Only this profiler mounts it, never the public API."""
    from django.urls import path
    from rest_framework.request import Request
    from rest_framework.response import Response

    from api.views import ApiView
    from config import urls

    class FloorApi(ApiView):
        def get(self, request: Request) -> Response:
            return Response({"ok": True})

    module = types.ModuleType("bench.profile_api.urls")
    module.urlpatterns = [  # type: ignore[attr-defined]
        path(FLOOR_PATH.lstrip("/"), FloorApi.as_view(), name="profile-floor"),
        *urls.urlpatterns,
    ]
    module.handler404 = urls.handler404  # type: ignore[attr-defined]
    module.handler500 = urls.handler500  # type: ignore[attr-defined]
    return module


# --------------------------------------------------------------------------- the data
@dataclass
class Fixture:
    organization: Any
    key: str
    detail_run: str  # completed, DETAIL_STEPS steps with outputs
    counts: dict[str, int] = field(default_factory=dict)


def _start(run_id: Any) -> None:
    """Started and running, as a worker's pick-up leaves it (at once when the start
    began it in its own transaction)."""
    from runs.engine import control
    from runs.engine.start import run_start
    from runs.models import Run

    run_start(run_id=run_id)
    if Run.objects.values_list("status", flat=True).get(pk=run_id) == "pending":
        control.pick_up(run_id)


def _complete(run_id: Any, price: Decimal) -> None:
    """Every step claimed and recorded with an output, in order, as a worker would."""
    from runs.engine.outcomes import Outcome, record
    from runs.models import Run, Step
    from runs.transitions import claim_step

    steps = Step.objects.filter(run_id=run_id).order_by("task__position", "position")
    for step_id, name in steps.values_list("pk", "name"):
        claimed = claim_step(step_id, worker="profile", task_id="profile", lease_seconds=60)
        if claimed is None:
            raise RuntimeError(f"step {step_id} of run {run_id} could not be claimed")
        output = {"step": name, "text": f"the output of {name}, " * 8, "n": step_id}
        record(step_id, run_id, claimed["attempts"], Outcome(output=output, cost=price))
    if Run.objects.values_list("status", flat=True).get(pk=run_id) != "completed":
        raise RuntimeError(f"run {run_id} did not complete")


def _sequence(name: str, steps: int) -> dict[str, Any]:
    """One task of ``steps`` sequential echo steps."""
    tasks = [
        {
            "name": "t",
            "steps": [{"name": f"s{i}", "tool": "echo", "params": {"i": i}} for i in range(steps)],
        }
    ]
    return {"name": name, "agents": [{"name": "a", "tasks": tasks}]}


def fixture(*, running: int = 60, completed: int = 10, created: int = 20) -> Fixture:
    """An organization, its key and a secret, runs in several states: ``running``
    running, ``completed`` small ones completed, ``created`` created, and the detail run."""
    from billing.models import Organization
    from billing.pricing import tool_price
    from billing.secrets import secret_put
    from billing.services import api_key_create, credits_grant, organization_create
    from runs import services

    organization = organization_create(name=f"profile-api-{uuid.uuid4().hex[:8]}")
    credits_grant(organization=organization, amount=Decimal(10_000_000), reason="profile-api")
    # Every start admitted at once, however many runs the profile leaves running.
    Organization.objects.filter(pk=organization.pk).update(
        max_running_runs=1_000_000, max_pending_runs=1_000_000, max_running_steps=1_000_000
    )
    organization.refresh_from_db()
    _, key = api_key_create(organization=organization, name="profile-api")
    secret_put(organization=organization, name="PROFILE_TOKEN", value="s3cr3t-value")
    price = tool_price("echo")

    def create(plan: dict[str, Any]) -> Any:
        return services.run_create(organization=organization, plan=plan, actor="profile").pk

    detail = create(_sequence("profile-detail", DETAIL_STEPS))
    _start(detail)
    _complete(detail, price)
    for index in range(completed):
        run_id = create(_sequence(f"profile-done-{index}", 3))
        _start(run_id)
        _complete(run_id, price)
    for _ in range(running):
        _start(create(PLAN))
    for _ in range(created):
        create(PLAN)
    counts = {"running": running, "completed": completed + 1, "created": created}
    return Fixture(organization, key, str(detail), counts)


def fresh_runs(fixture: Fixture, state: str, count: int) -> list[str]:
    """``count`` runs of PLAN, created (or started, for "running") for routes that
    change a run: each request acts on a run of its own."""
    from runs import services

    ids = []
    for _ in range(count):
        run_id = services.run_create(
            organization=fixture.organization, plan=PLAN, actor="profile"
        ).pk
        if state == "running":
            _start(run_id)
        ids.append(str(run_id))
    return ids


# --------------------------------------------------------------------------- requests
def environ(route: Route, key: str, run_id: str) -> dict[str, Any]:
    """The WSGI environ a server would hand Django for one request of ``route``."""
    body = b"" if route.body is None else json.dumps(route.body).encode()
    env: dict[str, Any] = {
        "REQUEST_METHOD": route.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": route.path.format(run=run_id),
        "QUERY_STRING": route.query,
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "localhost",
        "HTTP_ACCEPT": "application/json",
        "HTTP_AUTHORIZATION": f"Bearer {key}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if route.body is not None:
        env["CONTENT_TYPE"] = "application/json"
        env["CONTENT_LENGTH"] = str(len(body))
    if route.method == "POST":
        env["HTTP_IDEMPOTENCY_KEY"] = f"profile-{uuid.uuid4()}"
    return env


def call(handler: Any, env: dict[str, Any], ledger: Ledger | None = None) -> tuple[int, float]:
    """One request through ``handler`` (Django's WSGIHandler), its response read and
    closed as a server does (which returns the connection): its status and seconds."""
    statuses: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        statuses.append(status)
        return lambda data: None

    if ledger is not None:
        ledger.enter("django", force=True)
    started = time.perf_counter()
    result = handler(env, start_response)
    try:
        body = b"".join(result)
    finally:
        result.close()
    elapsed = time.perf_counter() - started
    if ledger is not None:
        ledger.leave()
    status = int(statuses[0].split()[0])
    if not 200 <= status < 300:
        raise RuntimeError(f"{env['REQUEST_METHOD']} {env['PATH_INFO']}: {status} {body[:500]!r}")
    return status, elapsed


# --------------------------------------------------------------------------- the report
@dataclass
class RouteReport:
    name: str
    label: str
    requests: int
    seconds: list[float]  # plain pass, one per request
    instrumented_seconds: list[float]
    ledger: Ledger
    statuses: Counter[int]

    def per_request(self, value: float) -> float:
        return value / self.requests

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.seconds) * 1000

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.seconds) * 1000

    @property
    def p95_ms(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000

    @property
    def instrumented_ms(self) -> float:
        return statistics.fmean(self.instrumented_seconds) * 1000

    def layer_ms(self, layer: str) -> float:
        return self.per_request(self.ledger.tallies[layer].seconds) * 1000

    @property
    def layers_ms(self) -> float:
        return sum(self.layer_ms(layer) for layer in LAYER_NAMES)

    @property
    def queries(self) -> float:
        return self.per_request(sum(t.statements for t in self.ledger.tallies.values()))

    @property
    def sql_ms(self) -> float:
        return self.per_request(sum(t.sql_seconds for t in self.ledger.tallies.values())) * 1000

    @property
    def compile_ms(self) -> float:
        return self.per_request(sum(t.compile_seconds for t in self.ledger.tallies.values())) * 1000

    @property
    def redis(self) -> float:
        return self.per_request(sum(t.redis for t in self.ledger.tallies.values()))

    @property
    def redis_ms(self) -> float:
        return self.per_request(sum(t.redis_seconds for t in self.ledger.tallies.values())) * 1000

    def as_dict(self) -> dict[str, Any]:
        layers = {}
        for layer in LAYER_NAMES:
            tally = self.ledger.tallies[layer]
            layers[layer] = {
                "ms": round(self.layer_ms(layer), 4),
                "percent": round(100 * self.layer_ms(layer) / (self.layers_ms or 1), 1),
                "queries": round(self.per_request(tally.statements), 3),
                "sql_ms": round(self.per_request(tally.sql_seconds) * 1000, 4),
                "redis": round(self.per_request(tally.redis), 3),
                "redis_ms": round(self.per_request(tally.redis_seconds) * 1000, 4),
                "compile_ms": round(self.per_request(tally.compile_seconds) * 1000, 4),
            }
        kinds = {
            kind: {
                "per_request": round(self.per_request(count), 3),
                "ms": round(self.per_request(self.ledger.kind_seconds[kind]) * 1000, 4),
            }
            for kind, count in self.ledger.kinds.most_common()
        }
        return {
            "route": self.label,
            "requests": self.requests,
            "statuses": {str(status): n for status, n in sorted(self.statuses.items())},
            "mean_ms": round(self.mean_ms, 3),
            "p50_ms": round(self.p50_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "instrumented_mean_ms": round(self.instrumented_ms, 3),
            "layers_sum_ms": round(self.layers_ms, 3),
            "queries": round(self.queries, 3),
            "sql_ms": round(self.sql_ms, 4),
            "compile_ms": round(self.compile_ms, 4),
            "redis": round(self.redis, 3),
            "redis_ms": round(self.redis_ms, 4),
            "layers": layers,
            "statements": kinds,
        }


@dataclass
class Report:
    routes: list[RouteReport]
    fixture_counts: dict[str, int]
    setup_seconds: float
    profiled_route: str | None = None
    profile_text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "routes": {route.name: route.as_dict() for route in self.routes},
            "layers": {name: about for name, _, about in LAYERS},
            "fixture": self.fixture_counts,
            "setup_seconds": round(self.setup_seconds, 2),
            "profiled_route": self.profiled_route,
        }


def table(report: Report) -> str:
    head = (
        f"{'route':<13}{'ms/req':>7}{'p50':>7}{'p95':>7} |{'queries':>8}{'SQL':>6}{'comp':>6}"
        f"{'redis':>6} |" + "".join(f"{column:>6}" for _, column, _ in LAYERS) + f" |{'sum':>6}"
    )
    lines = [head, "-" * len(head)]
    for route in report.routes:
        lines.append(
            f"{route.name:<13}{route.mean_ms:>7.2f}{route.p50_ms:>7.2f}{route.p95_ms:>7.2f} |"
            f"{route.queries:>8.1f}{route.sql_ms:>6.2f}{route.compile_ms:>6.2f}"
            f"{route.redis:>6.1f} |"
            + "".join(f"{route.layer_ms(layer):>6.2f}" for layer in LAYER_NAMES)
            + f" |{route.layers_ms:>6.2f}"
        )
    return "\n".join(lines)


def detail(route: RouteReport) -> str:
    lines = [
        f"{route.name} ({route.label}), per request, instrumented ({route.instrumented_ms:.2f} "
        f"ms against {route.mean_ms:.2f} plain):",
        f"  {'layer':<12}{'ms':>7}{'%':>6}{'queries':>9}{'SQL ms':>8}{'compile':>8}"
        f"{'redis':>7}{'redis ms':>9}",
    ]
    for layer in LAYER_NAMES:
        tally = route.ledger.tallies[layer]
        ms = route.layer_ms(layer)
        lines.append(
            f"  {layer:<12}{ms:>7.3f}{100 * ms / (route.layers_ms or 1):>6.1f}"
            f"{route.per_request(tally.statements):>9.2f}"
            f"{route.per_request(tally.sql_seconds) * 1000:>8.3f}"
            f"{route.per_request(tally.compile_seconds) * 1000:>8.3f}"
            f"{route.per_request(tally.redis):>7.2f}"
            f"{route.per_request(tally.redis_seconds) * 1000:>9.3f}"
        )
    lines.append(f"  {'per request':>14}{'ms':>8}  statement or round trip")
    for kind, count in route.ledger.kinds.most_common():
        ms = route.per_request(route.ledger.kind_seconds[kind]) * 1000
        lines.append(f"  {route.per_request(count):>14.2f}{ms:>8.3f}  {kind}")
    return "\n".join(lines)


def _short_paths(text: str) -> str:
    """File names as modules read them: the project's, site-packages' and the standard
    library's directories left out."""
    paths = sysconfig.get_paths()
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for directory in sorted(
        {paths["purelib"], paths["platlib"], paths["stdlib"], project}, key=len
    )[::-1]:
        text = text.replace(directory + os.sep, "")
    return text


# --------------------------------------------------------------------------- the run
def profile(
    *,
    requests: int = 300,
    warmup: int = 10,
    routes: tuple[str, ...] = ROUTE_NAMES,
    profiled_route: str | None = None,
    top: int = 25,
    sort: str = "tottime",
    out: Any = None,
) -> Report:
    """Set up the data, then send every route of ``routes`` plain, instrumented and (for
    ``profiled_route``) under cProfile. ``out``: where progress goes (None: nowhere)."""
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.utils import override_settings

    def say(text: str) -> None:
        if out is not None:
            print(text, file=out, flush=True)

    if requests < 1:
        raise ValueError("requests must be at least 1")
    chosen = [route for route in ROUTES if route.name in routes]
    unknown = set(routes) - set(ROUTE_NAMES)
    if unknown or (profiled_route is not None and profiled_route not in ROUTE_NAMES):
        raise ValueError(f"unknown route {sorted(unknown) or profiled_route}; {ROUTE_NAMES}")
    started = time.perf_counter()
    data = fixture()
    setup_seconds = time.perf_counter() - started
    say(f"set up in {setup_seconds:.1f} s: {data.counts}")
    reports: list[RouteReport] = []
    profile_text = ""
    with ExitStack() as stack:
        stack.enter_context(
            override_settings(ROOT_URLCONF=urlconf(), API_THROTTLE_RATE=THROTTLE_RATE)
        )
        with warnings.catch_warnings():  # WhiteNoise's, without collectstatic: no matter here
            warnings.filterwarnings("ignore", "No directory at", UserWarning)
            handler = WSGIHandler()
        for route in chosen:
            profiled = route.name == profiled_route
            runs: list[str] = []
            if route.consumes:
                needed = warmup + 2 * requests + (requests if profiled else 0)
                runs = fresh_runs(data, route.consumes, needed)
            ids = iter(runs)

            def env(route: Route = route, ids: Iterator[str] = ids) -> dict[str, Any]:
                run_id = next(ids) if route.consumes else data.detail_run
                return environ(route, data.key, run_id)

            statuses: Counter[int] = Counter()
            for _ in range(warmup):
                call(handler, env())
            plain = []
            for _ in range(requests):
                status, seconds = call(handler, env())
                statuses[status] += 1
                plain.append(seconds)
            ledger = Ledger()
            measured = []
            with instrumented(ledger):
                for _ in range(requests):
                    status, seconds = call(handler, env(), ledger)
                    statuses[status] += 1
                    measured.append(seconds)
            report = RouteReport(
                route.name, route.label, requests, plain, measured, ledger, statuses
            )
            reports.append(report)
            say(
                f"  {route.name:<13} {report.mean_ms:7.2f} ms/request, {report.queries:.1f} queries"
            )
            if profiled:
                profiler = cProfile.Profile()
                for _ in range(requests):
                    request_env = env()
                    profiler.enable()
                    call(handler, request_env)
                    profiler.disable()
                text = io.StringIO()
                stats = pstats.Stats(profiler, stream=text)
                stats.sort_stats(sort).print_stats(top)
                profile_text = (
                    f"cProfile of {route.name}, {requests} requests (times are totals; "
                    f"divide by {requests} for one request):\n{_short_paths(text.getvalue())}"
                )
    return Report(reports, data.counts, setup_seconds, profiled_route, profile_text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_api", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="per route and pass")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured requests per route")
    parser.add_argument(
        "--routes",
        default=",".join(ROUTE_NAMES),
        help="comma-separated, of " + ", ".join(ROUTE_NAMES),
    )
    parser.add_argument("--route", default="run", help="the route profiled for --top ('' none)")
    parser.add_argument("--top", type=int, default=30, help="functions shown for --route")
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"))
    parser.add_argument(
        "--json", metavar="PATH", help="also write the report as JSON ('-': stdout)"
    )
    args = parser.parse_args(argv)
    # As the web process runs (config/gunicorn.py, scripts/load.sh): no query log, its
    # connections from a pool.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    os.environ.setdefault("DJANGO_DEBUG", "false")
    os.environ.setdefault("DATABASE_POOL_SIZE", "10")
    import django

    django.setup()
    routes = tuple(name.strip() for name in args.routes.split(",") if name.strip())
    report = profile(
        requests=args.requests,
        warmup=args.warmup,
        routes=routes,
        profiled_route=args.route or None,
        top=args.top,
        sort=args.sort,
        out=sys.stderr,
    )
    if args.json == "-":
        json.dump(report.as_dict(), sys.stdout, indent=2)
        print()
        return 0
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report.as_dict(), handle, indent=2)
    print(
        f"{args.requests} requests per route through Django's WSGI handler in process "
        "(plain: ms/req, p50, p95; instrumented: the rest, ms per request by layer):"
    )
    print(table(report))
    print("layers: " + "; ".join(f"{column}: {about}" for _, column, about in LAYERS))
    print("routes: " + "; ".join(f"{route.name}: {route.label}" for route in ROUTES))
    print(
        "queries: SQL statements sent, COMMITs included; SQL: their ms; comp: ms the ORM spent "
        "writing SQL (SQLCompiler.as_sql); redis: round trips (a pipeline is one)"
    )
    for route in report.routes:
        if route.name == report.profiled_route:
            print()
            print(detail(route))
    if report.profile_text:
        print()
        print(report.profile_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
