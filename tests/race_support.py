"""Contender processes for race tests: spawned once, reused by every race.

A race test runs one operation per contender process against the same rows at the same
moment, each with its own PostgreSQL connection: ``contend([(operation, run_ids), ...])``
gives contender i the i-th job, and before each of their run ids all the job's contenders
meet at a barrier of as many parties, so they really contend for the row's lock.

The contenders are started with the ``spawn`` method: a forked child inherits the test
process's threads and locks (the Celery app's, the logging module's) in whatever state
they were, and can hang on them; a spawned child starts clean and sets Django up against
the test database. That setup costs seconds of CPU per process, so the contenders are a
pool, started lazily once per test process (each xdist worker has its own) and stopped at
its exit; each serves jobs from a queue of its own. What carries from one job to the next
and why it does not matter:

- connections: closed after every job (a test may flush the database between two), and
  the pool is started again if the test database's URL changes;
- settings: the test process's values of ``CARRIED_SETTINGS`` (which race tests set with
  pytest-django's ``settings``) apply in the contenders for the job's duration only. The
  environment is read at the spawn alone: a test's change to it would reach a pool
  started during that test and every race after, so race tests change settings instead;
- barriers: synchronisation primitives are shared only by inheritance, so the pool
  creates one cyclic ``Barrier(k)`` for each party count in ``PARTIES`` when it starts,
  and every contender is spawned with all of them.

A contender that raises or dies fails the race with its traceback or exit code, at once:
the pool is stopped (its processes terminated, wherever they were) and the next race
starts a fresh one. This module imports nothing from Django at import time: a contender
imports it before it sets Django up.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Sequence
from typing import Any

# Party counts a race may have: two contenders (tests/runs/test_races.py) or eight
# starters of one organization (tests/runs/test_admission_races.py).
PARTIES = (2, 8)
# Settings race tests change in the test process that the contenders must see too.
CARRIED_SETTINGS = ("ENGINE_START_AT_ONCE_STEPS", "ENGINE_LEASE_SECONDS")
# A contender that has not met the others this long after reaching a barrier breaks it.
BARRIER_SECONDS = 120
# A job's outcomes come back within this, or the race fails (a test's timeout is 300 s).
JOB_SECONDS = 240
# How often a waiting side checks that the other side is still alive.
LIVENESS_SECONDS = 1.0


def contend(jobs: Sequence[tuple[str, Sequence[str]]]) -> list[list[str]]:
    """Run each job, (operation, run ids), in a contender of its own, all at once: before
    each run id the jobs' contenders meet at a barrier (so the jobs have as many run ids
    each). What came of each job: an outcome per run id ("won", "refused", or what the
    operation named)."""
    global _pool
    from django.conf import settings

    from tests.support import shared_database_url

    database_url = shared_database_url()
    if _pool is not None and _pool.database_url != database_url:
        _pool.stop()
        _pool = None
    if _pool is None:
        _pool = _Pool(database_url)
    overrides = {name: getattr(settings, name) for name in CARRIED_SETTINGS}
    try:
        return _pool.run(jobs, overrides)
    except BaseException:
        # Whatever the contenders were doing (waiting at a barrier, in a transaction),
        # no later race must meet it.
        _pool.stop(at_once=True)
        _pool = None
        raise


class _Pool:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.context = multiprocessing.get_context("spawn")
        self.barriers = {
            parties: self.context.Barrier(parties, timeout=BARRIER_SECONDS) for parties in PARTIES
        }
        self.results: Any = self.context.Queue()
        self.processes: list[Any] = []
        self.queues: list[Any] = []
        self.jobs_sent = 0

    def run(
        self, jobs: Sequence[tuple[str, Sequence[str]]], overrides: dict[str, Any]
    ) -> list[list[str]]:
        parties = len(jobs)
        assert parties in self.barriers, f"a race of {parties} contenders: PARTIES has {PARTIES}"
        assert len({len(run_ids) for _, run_ids in jobs}) == 1, "jobs of unequal lengths"
        while len(self.processes) < parties:
            self._spawn()
        self.jobs_sent += 1
        number = self.jobs_sent
        for index, (operation, run_ids) in enumerate(jobs):
            self.queues[index].put((number, operation, list(run_ids), parties, overrides))
        outcomes: dict[int, list[str]] = {}
        deadline = time.monotonic() + JOB_SECONDS
        while len(outcomes) < parties:
            try:
                index, answered, said, failure = self.results.get(timeout=LIVENESS_SECONDS)
            except queue.Empty:
                for index, process in enumerate(self.processes[:parties]):
                    assert process.is_alive(), (
                        f"contender {index} died (exit code {process.exitcode})"
                    )
                assert time.monotonic() < deadline, (
                    f"no outcomes from the contenders in {JOB_SECONDS} s"
                )
                continue
            assert answered == number, f"contender {index} answered job {answered}, not {number}"
            assert failure is None, f"contender {index} ({jobs[index][0]}) failed:\n{failure}"
            outcomes[index] = said
        return [outcomes[index] for index in range(parties)]

    def _spawn(self) -> None:
        if not self.processes:
            atexit.register(self.stop)
        jobs: Any = self.context.Queue()
        process = self.context.Process(
            target=contender,
            args=(len(self.processes), self.database_url, self.barriers, jobs, self.results),
            daemon=True,
        )
        process.start()
        self.processes.append(process)
        self.queues.append(jobs)

    def stop(self, at_once: bool = False) -> None:
        """Stop the contenders: after their job (``at_once``: wherever they are)."""
        atexit.unregister(self.stop)
        for process, jobs in zip(self.processes, self.queues, strict=True):
            if at_once:
                process.terminate()
            else:
                jobs.put(None)
        for process, jobs in zip(self.processes, self.queues, strict=True):
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
            jobs.cancel_join_thread()
            jobs.close()
        self.results.cancel_join_thread()
        self.results.close()
        self.processes, self.queues = [], []


_pool: _Pool | None = None


def contender(
    index: int, database_url: str, barriers: dict[int, Any], jobs: Any, results: Any
) -> None:
    """One contender: serve jobs until told to stop (None) or the test process is gone."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.test"
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections
    from django.test.utils import override_settings

    settings.ORCHESTRATOR_DISPATCH_ENABLED = False
    parent = multiprocessing.parent_process()
    while True:
        try:
            job = jobs.get(timeout=LIVENESS_SECONDS)
        except queue.Empty:
            if parent is None or not parent.is_alive():
                return  # the test process was killed: nobody will stop this one
            continue
        if job is None:
            return
        number, operation, run_ids, parties, overrides = job
        said: list[str] | None = None
        failure = None
        try:
            with override_settings(**overrides):
                said = _contend(OPERATIONS[operation], run_ids, barriers[parties])
        except Exception:  # noqa: BLE001 - the race fails with it, in the test process
            failure = traceback.format_exc()
        finally:
            # Before the answer: the test may flush the database as soon as it has it.
            connections.close_all()
        results.put((index, number, said, failure))


def _contend(do: Any, run_ids: list[str], barrier: Any) -> list[str]:
    from runs.services import RunDeleted
    from runs.states import InvalidTransition

    outcomes = []
    for run_id in run_ids:
        barrier.wait()
        try:
            # An operation may say it lost (False) without raising, or name its outcome.
            said = do(run_id)
            if not isinstance(said, str):
                said = "refused" if said is False else "won"
            outcomes.append(said)
        except (InvalidTransition, RunDeleted):
            outcomes.append("refused")
    return outcomes


def _complete(run_id: str) -> None:
    from django.db import transaction

    from runs import services
    from tests.factories import finish_all_work

    # As the engine does: the last piece of work and the run finish in one transaction,
    # which takes the run's lock first (the lock order is run -> agent -> task -> step).
    with transaction.atomic():
        run = services.lock_run(run_id)
        finish_all_work(run)
        services.run_complete(run_id=run_id)


def _fail(run_id: str) -> None:
    from runs import services

    services.run_fail(run_id=run_id, code="tool_error", message="lost the race?")


def _start(run_id: str) -> None:
    from runs.engine.start import run_start

    run_start(run_id=run_id)


def _cancel(run_id: str) -> None:
    from runs import services

    services.run_cancel(run_id=run_id, reason="race")


def _start_admitted(pair: str, side: int) -> bool:
    """Start one run of the pair: was it admitted at once?"""
    from runs.engine.start import run_start

    return run_start(run_id=pair.split("|")[side]).admitted_at is not None


def _start_outcome(run_id: str) -> str:
    """Start the run as a client would: what came of it (running, waiting, or the code
    of the refusal)."""
    from billing.services import InsufficientCredits
    from runs.admission.run_admission import TooManyPendingRuns
    from runs.engine.start import run_start

    try:
        run = run_start(run_id=run_id)
    except (TooManyPendingRuns, InsufficientCredits) as refused:
        return refused.code
    return "running" if run.status == "running" else "waiting"


def _take_slot(organization_id: str) -> bool:
    from runs.admission import fairness

    return fairness.acquire_slot(organization_id, f"taker-{os.getpid()}") is not None


def _free_and_take_slot(organization_id: str) -> bool:
    """Let the slot held by "leaving" go, then take one: as a worker that finished a
    step and starts the next while another worker takes a slot."""
    from runs.admission import fairness
    from runs.models import StepSlot

    leaving = StepSlot.objects.get(organization_id=organization_id, holder="leaving")
    fairness.release_slot(fairness.Slot(leaving.pk, organization_id, leaving.slot, "leaving"))
    return fairness.acquire_slot(organization_id, f"taker-{os.getpid()}") is not None


def _record(step_name: str) -> Any:
    """Record the claimed step ``step_name`` of the run as completed, as its worker does
    (the hot path's function, or the general path where that declines)."""

    def record(run_id: str) -> bool:
        from decimal import Decimal

        from runs.engine.outcomes import Outcome, record
        from runs.models import Step

        step = Step.objects.get(run_id=run_id, name=step_name)
        return record(step.pk, run_id, step.attempts, Outcome({"by": step_name}, Decimal("0.01")))

    return record


def _record_and_claim(step_name: str) -> Any:
    """``_record``, with the worker's next step of the run claimed in the same call."""

    def record(run_id: str) -> bool:
        from decimal import Decimal

        from runs.engine import hotpath
        from runs.engine.outcomes import Outcome, record_and_claim
        from runs.models import Step

        # The first attempt's: a retry racing it may have made the next attempt's.
        step = Step.objects.get(run_id=run_id, name=step_name, attempt_number=1)
        claim = hotpath.Claim(worker=f"w-{step_name}", task_id=step_name, lease_seconds=600)
        outcome = Outcome({"by": step_name}, Decimal("0.01"))
        return record_and_claim(step.pk, run_id, step.attempts, outcome, claim)[0]

    return record


def _record_and_claim_batch(step_name: str) -> Any:
    """``_record_and_claim``, claiming up to four of the run's next steps at once (a
    server's batch)."""

    def record(run_id: str) -> bool:
        from decimal import Decimal

        from runs.engine import hotpath
        from runs.engine.outcomes import Outcome, record_and_claim
        from runs.models import Step

        step = Step.objects.get(run_id=run_id, name=step_name)
        claim = hotpath.Claim(f"w-{step_name}", step_name, 600, batch=4)
        outcome = Outcome({"by": step_name}, Decimal("0.01"))
        return record_and_claim(step.pk, run_id, step.attempts, outcome, claim)[0]

    return record


def _record_failure(step_name: str) -> Any:
    """Record the claimed step ``step_name`` of the run as failed, retryable and charged
    its price, as its worker does (the general path's)."""

    def record(run_id: str) -> bool:
        from decimal import Decimal

        from common.tools.base import ToolError
        from runs.engine.outcomes import Outcome, record
        from runs.models import Step

        step = Step.objects.get(run_id=run_id, name=step_name)
        error = ToolError("timeout", "slow", True)
        return record(step.pk, run_id, step.attempts, Outcome(error=error, cost=Decimal("0.01")))

    return record


def _hand_back(run_id: str) -> bool:
    """Hand back the steps the worker "held" claimed and did not start (as a server
    that stops with a batch in hand): whether any became claimable."""
    from runs.models import Step
    from runs.transitions import hand_back_steps

    held = Step.objects.filter(run_id=run_id, status="running", worker="held")
    steps = list(held.values_list("pk", "attempts"))
    return hand_back_steps(run_id, steps, actor="held") > 0


def _pause(run_id: str) -> None:
    from runs import services

    services.run_pause(run_id=run_id, actor="race")


def _fail_and_retry(run_id: str) -> None:
    """Fail the run, retry it and pick its next attempt up: three transactions, as an
    operator's two requests and the worker's pick-up are."""
    from runs import services
    from runs.engine import control

    services.run_fail(run_id=run_id, code="tool_error", message="retried in the race")
    services.run_retry(run_id=run_id, actor="race")
    control.pick_up(run_id)


def _resume(run_id: str) -> None:
    """Resume a paused run, and the worker's resume after it."""
    from runs import services
    from runs.engine import control

    services.run_resume(run_id=run_id, actor="race")
    control.resume(run_id)


def _delete(run_id: str) -> None:
    from runs import services

    services.run_delete(run_id=run_id, actor="race")


OPERATIONS = {
    "record_a": _record("a"),
    "record_b": _record("b"),
    "record_a_again": _record("a"),  # the same attempt, delivered twice
    "record_a_failed": _record_failure("a"),
    "record_a_claiming": _record_and_claim("a"),
    "record_b_claiming": _record_and_claim("b"),
    "record_a_batch": _record_and_claim_batch("a"),
    "record_b_batch": _record_and_claim_batch("b"),
    "hand_back": _hand_back,
    "pause": _pause,
    "complete": _complete,
    "fail": _fail,
    "start": _start,
    "cancel": _cancel,
    "fail_and_retry": _fail_and_retry,
    "resume": _resume,
    "delete": _delete,
    "start_left": lambda pair: _start_admitted(pair, 0),
    "start_right": lambda pair: _start_admitted(pair, 1),
    "start_outcome": _start_outcome,
    "take_slot": _take_slot,
    "take_slot_too": _take_slot,
    "free_and_take_slot": _free_and_take_slot,
}
