"""Fixtures shared by the whole suite.

Integration tests get a real Celery worker process (`celery_worker`) consuming the
workers' queues of the throwaway Redis and writing to the test database pytest-django
created; those that send run webhooks add the `webhooks` process (`webhooks_worker`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from hypothesis import Phase
from hypothesis import settings as hypothesis_settings
from xdist.scheduler import LoadScopeScheduling

from bench.collector import Collector
from config.celery import QUEUE_WEBHOOKS, WORKER_QUEUES, app
from tests import factories
from tests.support import Child, child_env, python_cmd, tracing_env, wait_until, worker_cmd
from tests.tenants import LiveTenant, Tenant, make_tenant
from tests.tracing_support import traced_spans

if TYPE_CHECKING:  # imported by pytest as a plugin (below), where its asserts are rewritten
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.http_fixture import HttpServer

# `http_server`: a scriptable local HTTP server (tests/http_fixture.py).
pytest_plugins = ["tests.http_fixture"]
# The plan tests' shared assertions (tests/runs/plans.py) explain their failures as a test's
# own asserts do: registered before any test module imports it.
pytest.register_assert_rewrite("tests.runs.plans")

# Property tests: `make test` must be deterministic, so by default the examples are derived
# from each test rather than random (the same examples on every run and machine).
# `HYPOTHESIS_PROFILE=explore` draws fresh random examples on every run, to hunt for new
# failures (found that way: a NUL character in a cancel reason). Neither profile has
# the explain phase: on Python 3.11 it traces every line of a failing example, and a
# database-backed state machine then takes minutes to report, hitting the test timeout
# and hiding the failure it found.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
hypothesis_settings.register_profile("default", derandomize=True, phases=_PHASES)
hypothesis_settings.register_profile("explore", phases=_PHASES)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# `make test` runs the suite in parallel processes (pytest-xdist). These modules each
# start a whole stack of their own (web, workers, beat, stores, or a cluster of network
# namespaces) and time its recovery: they run one after another in one process, beside
# the rest of the suite rather than beside each other. (A scheduler of our own rather
# than `xdist_group` marks: xdist 3.8 names a test's group by rewriting a private
# attribute of pytest's items that pytest 9 no longer reads.)
_WHOLE_STACKS = frozenset(
    {
        "tests/integration/test_chaos.py",
        "tests/integration/test_cluster.py",
        "tests/browser/test_first_run.py",
        "tests/integration/test_make_run.py",
        "tests/integration/test_store_failover.py",
        "tests/integration/test_timer_restart.py",
    }
)


class _WholeStacksTogether(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
    """Every test is a scope of its own (as with ``--dist load``), except the whole
    stacks' modules, which are one."""

    def _split_scope(self, nodeid: str) -> str:
        return "whole-stacks" if nodeid.split("::", 1)[0] in _WHOLE_STACKS else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> _WholeStacksTogether:
    return _WholeStacksTogether(config, log)


@pytest.fixture(autouse=True)
def _dispatch_only_with_a_worker(request: pytest.FixtureRequest, settings: Any) -> None:
    """Tests without a worker keep engine messages to themselves.

    The session's worker process outlives the integration tests that started it; a
    service-level test that commits (transaction=True) must not have it pick up and
    execute that test's runs behind its back.
    """
    if not {"celery_worker", "webhooks_worker"} & set(request.fixturenames):
        settings.ORCHESTRATOR_DISPATCH_ENABLED = False


@pytest.fixture(scope="session", autouse=True)
def _nothing_connected_at_the_end(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Before pytest-django drops the test database, end the sessions still connected
    to it: threads of tests (a pool's, the live server's) keep their connections when
    they end, and the drop then failed, leaving the database and a warning behind."""
    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="session")
def broker() -> Iterator[redis.Redis[bytes]]:

    client: redis.Redis[bytes] = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="session")
def otlp_collector() -> Iterator[Collector]:
    """An OTLP/HTTP trace receiver on the loopback, keeping what it decodes: the session's
    worker exports its spans to it (tests/integration/test_traces.py)."""
    collector = Collector(keep=True).start()
    yield collector
    collector.stop()


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    """Tracing on in the test process for one test, its spans in memory
    (tests/tracing_support.py)."""
    yield from traced_spans()


@pytest.fixture
def tenant(db: None) -> Tenant:
    return make_tenant()


@pytest.fixture
def other_tenant(db: None) -> Tenant:
    return make_tenant()


@pytest.fixture
def new_tenant(db: None) -> Callable[..., Tenant]:
    return make_tenant


@pytest.fixture
def live(live_server: Any) -> LiveTenant:
    """A new organization and its key, on pytest-django's live server."""
    organization, key = factories.org_with_key()
    return LiveTenant(live_server.url, key, organization)


@pytest.fixture
def operator(client: Client) -> Client:
    """The test client signed in to the admin as a superuser."""
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "a-long-password"))
    return client


def _answers_ping(worker: Child, hostname: str) -> bool:
    if not worker.alive():
        raise AssertionError(f"{hostname} exited early:\n{worker.output()}")
    replies = app.control.ping(destination=[hostname], timeout=0.5) or []
    return any(hostname in reply for reply in replies)


def _serving(worker: Child, hostname: str) -> Iterator[str]:
    """Yield ``hostname`` once its worker answers a ping; then stop it: a warm shutdown,
    then SIGKILL to its group (nothing here must survive)."""
    try:
        wait_until(
            partial(_answers_ping, worker, hostname),
            timeout=60,
            what=f"{hostname} to answer a ping",
        )
        yield hostname
    finally:
        worker.stop(timeout=10)
        worker.kill_group()


@pytest.fixture(scope="session")
def celery_worker(
    django_db_setup: None,
    broker: redis.Redis[bytes],
    tmp_path_factory: pytest.TempPathFactory,
    llm_server: HttpServer,
    otlp_collector: Collector,
) -> Iterator[str]:
    """Start one real worker process (prefork, 2 children), as the Procfile's `worker`:
    every queue but the webhooks'; yield its hostname."""
    hostname = f"test-{uuid.uuid4().hex[:8]}@localhost"
    log: Path = tmp_path_factory.mktemp("worker") / "worker.log"
    worker = Child(
        worker_cmd(hostname, ",".join(WORKER_QUEUES)),
        # Polls, callback requests and webhooks reach the tests' own HTTP servers, on
        # loopback; the LLM planner and llm steps reach the session's LLM server.
        # Its spans go to the session's OTLP collector (docs/observability.md).
        child_env(
            HTTP_TOOL_ALLOWED_NETWORKS="127.0.0.0/8",
            LLM_BASE_URL=llm_server.llm_base_url,
            **tracing_env(otlp_collector.endpoint),
        ),
        log,
    )  # fmt: skip

    yield from _serving(worker, hostname)


@pytest.fixture
def webhooks_worker(
    webhooks_process: str, transactional_db: None, broker: redis.Redis[bytes]
) -> Iterator[str]:
    """The session's `webhooks` process, for one test; yield its hostname. After the test,
    before its rows are flushed, the process is quiet: the test's pending deliveries are
    ended (a send or a sweep it still holds finds nothing to do), and nothing is queued
    or running. Else it went on sending a test's backlog into the next test (a stray sweep
    claimed that test's delivery) and its writes deadlocked with the flush."""
    yield webhooks_process
    from webhooks.models import DeliveryStatus, WebhookDelivery

    WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).update(
        status=DeliveryStatus.FAILED, lease_token=None
    )
    wait_until(
        partial(_quiet, webhooks_process, broker),
        timeout=60,
        what="the webhooks process to finish what it held",
    )


def _quiet(hostname: str, broker: redis.Redis[bytes]) -> bool:
    if broker.llen(QUEUE_WEBHOOKS):
        return False
    inspect = app.control.inspect(destination=[hostname], timeout=1)
    held = [inspect.active() or {}, inspect.reserved() or {}]
    return all(hostname in found and not found[hostname] for found in held)


@pytest.fixture(scope="session")
def webhooks_process(
    django_db_setup: None, broker: redis.Redis[bytes], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Start the Procfile's `webhooks` process (the webhooks queue alone, a pool of
    threads); yield its hostname (tests take it through ``webhooks_worker``)."""
    hostname = f"webhooks-{uuid.uuid4().hex[:8]}@localhost"
    log: Path = tmp_path_factory.mktemp("webhooks") / "webhooks.log"
    worker = Child(
        python_cmd(
            "-m", "celery", "-A", "config", "worker",
            "--queues", QUEUE_WEBHOOKS,
            "--pool", "threads",
            "--concurrency", "10",
            "--hostname", hostname,
            "--loglevel", "INFO",
            "--without-mingle", "--without-gossip",
        ),
        child_env(HTTP_TOOL_ALLOWED_NETWORKS="127.0.0.0/8"),  # the tests' receivers
        log,
    )  # fmt: skip
    yield from _serving(worker, hostname)
