"""`python -m bench.profile_api`: where an API request's time goes, layer by layer.

Sets up an organization with an API key, a secret and runs in several states (created,
running, completed with outputs), then sends each route ``--requests`` times (300)
through the whole Django stack in this process: a WSGI call of Django's own handler with
every middleware, the real `Authorization: Bearer` key, the real throttle against Redis,
an `Idempotency-Key` on every POST, and the database connection borrowed from a pool and
returned after each request, as the web process does (config/gunicorn.py). Nothing is
mocked: the layers are only timed.

Each route is sent three ways: plain (the time per request reported), instrumented (the
time split into layers: ``bench.api_layers``, whose LAYERS says what each holds) and, for
``--route``, under cProfile (``--top`` functions). The data is ``bench.api_fixture``'s.

The throttle's rate is raised so that nothing is refused (its Redis script runs as
ever), and the organization's run limits so that every start is admitted at once.
Expects migrated PostgreSQL at DATABASE_URL and Redis at CELERY_BROKER_URL:
``scripts/bench.sh profile-api`` (``make profile-api``) starts throwaway ones.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import sysconfig
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from bench.api_fixture import FLOOR_PATH, PLAN, fixture, fresh_runs, urlconf
from bench.api_layers import LAYER_NAMES, LAYERS, Ledger, instrumented

THROTTLE_RATE = "100000000/min"  # nothing refused; the script's round trip is the same


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
