"""Fixtures shared by the whole suite.

Integration tests get a real Celery worker process (`celery_worker`) consuming every
queue of the throwaway Redis and writing to the test database pytest-django created.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from django.conf import settings
from hypothesis import Phase
from hypothesis import settings as hypothesis_settings

from config.celery import ALL_QUEUES, app
from tests.support import Child, child_env, python_cmd, wait_until

if TYPE_CHECKING:  # imported by pytest as a plugin (below), where its asserts are rewritten
    from tests.http_fixture import HttpServer

# `http_server`: a scriptable local HTTP server (tests/http_fixture.py).
pytest_plugins = ["tests.http_fixture"]

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


@pytest.fixture(autouse=True)
def _dispatch_only_with_a_worker(request: pytest.FixtureRequest, settings: Any) -> None:
    """Tests without a worker keep engine messages to themselves.

    The session's worker process outlives the integration tests that started it; a
    service-level test that commits (transaction=True) must not have it pick up and
    execute that test's runs behind its back.
    """
    if "celery_worker" not in request.fixturenames:
        settings.ORCHESTRATOR_DISPATCH_ENABLED = False


@pytest.fixture(scope="session")
def broker() -> Iterator[redis.Redis[bytes]]:

    client: redis.Redis[bytes] = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="session")
def celery_worker(
    django_db_setup: None,
    broker: redis.Redis[bytes],
    tmp_path_factory: pytest.TempPathFactory,
    llm_server: HttpServer,
) -> Iterator[str]:
    """Start one real worker process (prefork, 2 children); yield its hostname."""
    hostname = f"test-{uuid.uuid4().hex[:8]}@localhost"
    log: Path = tmp_path_factory.mktemp("worker") / "worker.log"
    worker = Child(
        python_cmd(
            "-m", "celery", "-A", "config", "worker",
            "--queues", ",".join(ALL_QUEUES),
            "--concurrency", "2",
            "--pool", "prefork",
            "--hostname", hostname,
            "--loglevel", "INFO",
            "--without-mingle", "--without-gossip",
        ),
        # Polls, callback requests and webhooks reach the tests' own HTTP servers, on
        # loopback; the LLM planner and llm steps reach the session's LLM server.
        child_env(HTTP_TOOL_ALLOWED_NETWORKS="127.0.0.0/8", LLM_BASE_URL=llm_server.llm_base_url),
        log,
    )  # fmt: skip

    def answered() -> bool:
        if not worker.alive():
            raise AssertionError(f"worker exited early:\n{worker.output()}")
        replies = app.control.ping(destination=[hostname], timeout=0.5) or []
        return any(hostname in reply for reply in replies)

    try:
        wait_until(answered, timeout=60, what="the Celery worker to answer a ping")
        yield hostname
    finally:
        worker.stop(timeout=10)  # warm shutdown, then SIGKILL: nothing here must survive
        worker.kill_group()
