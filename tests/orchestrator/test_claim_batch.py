"""Batches, in process and in a worker process killed: a server whose last step was short
claims several of its run's next steps with the recording and runs them in turn, without
hoarding them (docs/engine.md, "Batches").

The steps of a batch not started yet are RUNNING under the lease their claim gave them,
as a step claimed alone is: a worker that dies holding them leaves them to the lease
sweep, which reclaims them as any claimed step. Those the server will not start (the run
paused or cancelled, its serving over, or too long a wait behind a slow step) it hands
back: claimable again, or paused with the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.utils import timezone

from billing.pricing import tool_price
from common.invariants import violations
from orchestrator import executor, sweeps
from orchestrator.lease_keeper import Held, lease_keeper
from orchestrator.transport import CeleryTransport
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.selectors import run_history
from tests import factories
from tests.factories import step
from tests.support import ROOT, child_env

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings as SettingsWrapper

    from billing.models import Organization

pytestmark = pytest.mark.django_db(transaction=True)

HANDED_BACK = "handed back unstarted"


@pytest.fixture(autouse=True)
def batches(settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of four after any step, and a server's burst and fair slice long enough
    for a whole run (on a busy test machine, a no-op may take longer than the production
    threshold, or than a slice: a recording after the slice makes the fair choice and
    claims one step)."""
    settings.ENGINE_CLAIM_BATCH = 4
    settings.ENGINE_BURST_SECONDS = 60
    settings.ENGINE_FAIR_SLICE = 60
    monkeypatch.setattr(executor, "BATCH_AFTER_S", 60.0)


@pytest.fixture
def rings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The doorbells rung (run, reason); nothing leaves the process."""
    rung: list[tuple[str, str]] = []

    def ring(self: CeleryTransport, runs: dict[str, int], reason: str) -> None:
        rung.extend((run_id, reason) for run_id in runs)

    monkeypatch.setattr(CeleryTransport, "ring", ring)
    monkeypatch.setattr(CeleryTransport, "call_for_help", lambda self, run_id, priority: False)
    return rung


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many steps each batch held beyond the one its server started next."""
    sizes: list[int] = []
    keep = lease_keeper.keep

    def spy(held: Held) -> None:
        sizes.append(len(held.steps))
        keep(held)

    monkeypatch.setattr(lease_keeper, "keep", spy)
    return sizes


def started(*steps: dict[str, Any], organization: Organization | None = None) -> Run:
    """A run of one task whose steps all run at once (leaves), picked up."""
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0] = {
        "name": "work",
        "mode": "parallel",
        "max_concurrent_steps": 100,
        "steps": list(steps),
    }
    run = services.run_create(organization=organization or factories.org(), plan=spec)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    return Run.objects.get(pk=run.pk)


def noops(*names: str) -> list[dict[str, Any]]:
    return [step(name) for name in names]


def serve(run: Run, task_id: str = "bell-1") -> int:
    return executor.serve(
        str(run.pk), run.priority, worker="worker:test", task_id=task_id, hard_limits=False
    )


def steps_of(run: Run) -> dict[str, Step]:
    return {s.name: s for s in Step.objects.filter(run=run)}


def handed_back(run: Run) -> set[str]:
    ids = (
        run_history(run)
        .filter(entity="step", message=HANDED_BACK)
        .values_list("entity_id", flat=True)
    )
    return set(Step.objects.filter(pk__in=[int(i) for i in ids]).values_list("name", flat=True))


def allow(settings: SettingsWrapper, name: str) -> str:
    path = f"{__name__}.{name}"
    settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
    return path


def assert_ran_once(run: Run) -> None:
    """Completed, every step charged once (its price on its row, whatever attempt
    recorded it; the same drawn on the reservation: runs.attempt_charges), the books and
    the invariants whole."""
    run.refresh_from_db()
    assert run.status == "completed", run.last_error
    costs = {name: s.cost for name, s in steps_of(run).items()}
    assert costs == {name: tool_price(s.tool) for name, s in steps_of(run).items()}
    assert violations() == {}


def test_after_a_short_step_a_server_claims_a_batch_and_runs_it_in_turn(
    rings: list[tuple[str, str]], kept: list[int]
) -> None:
    run = started(*noops(*(f"s{i}" for i in range(12))))

    assert serve(run) == 12

    assert kept[:1] == [3]  # four claimed: one to start, three held
    steps = steps_of(run)
    assert {(s.status, s.attempts, s.celery_task_id) for s in steps.values()} == {
        ("completed", 1, "bell-1")
    }
    assert handed_back(run) == set()
    assert_ran_once(run)


def test_a_batch_takes_no_more_than_its_organizations_running_steps(
    rings: list[tuple[str, str]], kept: list[int]
) -> None:
    organization = factories.org()
    organization.max_running_steps = 2
    organization.save(update_fields=["max_running_steps"])
    run = started(*noops(*(f"s{i}" for i in range(12))), organization=organization)

    assert serve(run) == 12

    assert kept
    assert set(kept) == {1}
    assert_ran_once(run)


def test_after_a_long_step_a_server_claims_one_step_at_a_time(
    rings: list[tuple[str, str]], kept: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor, "BATCH_AFTER_S", 0.0)
    run = started(*noops(*(f"s{i}" for i in range(8))))

    assert serve(run) == 8

    assert kept == []
    assert_ran_once(run)


def pauses_its_run(run_id: str) -> str:
    services.run_pause(run_id=run_id, actor="test")
    return "paused"


def cancels_its_run(run_id: str) -> str:
    services.run_cancel(run_id=run_id, reason="from inside", actor="test")
    return "cancelled"


def test_a_pause_puts_the_held_steps_back_paused_and_resume_runs_each_once(
    settings: SettingsWrapper, rings: list[tuple[str, str]], kept: list[int]
) -> None:
    # s0's recording claims pauser, s2, s3 and s4; pauser pauses the run: s2 - s4 were
    # claimed but not started, and must not start while the run is paused.
    path = allow(settings, "pauses_its_run")
    pauser = step("pauser", "python", params={"callable": path, "kwargs": {"run_id": "${run.id}"}})
    run = started(step("s0"), pauser, *noops(*(f"s{i}" for i in range(2, 10))))

    assert serve(run) == 2

    assert kept == [3]
    assert Run.objects.get(pk=run.pk).status == "paused"
    steps = steps_of(run)
    assert (steps["s0"].status, steps["pauser"].status) == ("completed", "completed")
    held = {f"s{i}" for i in range(2, 5)}
    assert handed_back(run) == held
    others = {name: s for name, s in steps.items() if name not in ("s0", "pauser")}
    assert {(s.status, s.attempts, s.worker) for s in others.values()} == {("paused", 0, "")}

    services.run_resume(run_id=run.pk)
    assert control.resume(run.pk)
    assert serve(run, "bell-2") == 8

    assert {s.attempts for s in steps_of(run).values()} == {1}
    assert_ran_once(run)


def test_a_cancel_with_a_batch_held_leaves_nothing_to_run(
    settings: SettingsWrapper, rings: list[tuple[str, str]], kept: list[int]
) -> None:
    path = allow(settings, "cancels_its_run")
    canceller = step(
        "canceller", "python", params={"callable": path, "kwargs": {"run_id": "${run.id}"}}
    )
    run = started(step("s0"), canceller, *noops(*(f"s{i}" for i in range(2, 10))))

    assert serve(run) == 2  # the canceller's result dropped: the server stops there

    assert kept == [3]
    steps = steps_of(run)
    assert steps.pop("s0").status == "completed"
    assert {s.status for s in steps.values()} == {"cancelled"}
    assert (str(run.pk), "dropped") in rings
    assert violations() == {}


def test_steps_held_behind_a_slow_step_are_handed_back_for_other_servers(
    settings: SettingsWrapper, rings: list[tuple[str, str]], kept: list[int]
) -> None:
    # s0's recording claims slow, s2, s3 and s4; slow runs past the hold, so the
    # lease keeper thread hands s2 - s4 back (claimable, a doorbell rung for them) rather
    # than keep them from other servers for a second.
    settings.ENGINE_CLAIM_BATCH_HOLD_SECONDS = 0.2
    slow = step("slow", "sleep", params={"seconds": 1})
    run = started(step("s0"), slow, *noops(*(f"s{i}" for i in range(2, 10))))

    assert serve(run) == 10

    assert kept[:1] == [3]
    assert handed_back(run) == {"s2", "s3", "s4"}
    assert (str(run.pk), "handed_back") in rings
    assert {s.attempts for s in steps_of(run).values()} == {1}  # the hand-back's taken back
    assert_ran_once(run)


def test_a_burst_spent_during_a_batch_ends_after_it_and_rings_once(
    settings: SettingsWrapper, rings: list[tuple[str, str]], kept: list[int]
) -> None:
    # s0's recording claims s1, slow, s3 and s4; the burst's time runs out during slow.
    # The server serves s3 and s4 (short: they would only be handed back and claimed
    # again) and then rings for the rest, once.
    settings.ENGINE_BURST_SECONDS = 0.5
    settings.ENGINE_CLAIM_BATCH_HOLD_SECONDS = 1.4
    slow = step("slow", "sleep", params={"seconds": 0.6})
    run = started(step("s0"), step("s1"), slow, *noops(*(f"s{i}" for i in range(3, 10))))

    assert serve(run) == 5

    assert kept == [3]
    assert rings == [(str(run.pk), "burst")]
    assert handed_back(run) == set()
    statuses = {name: s.status for name, s in steps_of(run).items()}
    assert {name for name, status in statuses.items() if status == "completed"} == {
        "s0",
        "s1",
        "slow",
        "s3",
        "s4",
    }


def kills_its_worker() -> dict[str, bool]:
    """The worker process dies here when told to (KILL_WORKER), as at a crash."""
    if os.environ.get("KILL_WORKER"):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"alive": True}


def test_a_worker_killed_with_a_batch_held_has_every_step_recovered_and_run_once(
    settings: SettingsWrapper, rings: list[tuple[str, str]]
) -> None:
    # A worker process serves the run: s0's recording claims killer, s2, s3 and s4, and
    # killer kills the process. The three it held never started; all four are RUNNING
    # under their claim's lease, which the lease sweep reclaims as it reclaims any step
    # whose worker died. Served again, each step completes and is charged once.
    path = allow(settings, "kills_its_worker")
    killer = step("killer", "python", params={"callable": path})
    run = started(step("s0"), killer, *noops(*(f"s{i}" for i in range(2, 10))))
    # Nothing it would send leaves it (a worker of the session could answer).
    script = (
        "import sys, django; django.setup(); from django.conf import settings; "
        "from orchestrator import executor; from orchestrator.transport import CeleryTransport; "
        "settings.ORCHESTRATOR_DISPATCH_ENABLED = False; "
        "CeleryTransport.ring = lambda *args: None; "
        "CeleryTransport.call_for_help = lambda *args: False; "
        "executor.BATCH_AFTER_S = 60.0; "
        "executor.serve(sys.argv[1], 5, worker='victim', task_id='bell-victim', "
        "hard_limits=False)"
    )
    # Leases and the hold far longer than the child can take, however loaded the
    # machine: importing the killer's module took over a second once, the hold's hand-back
    # and the killer's renewals went first, and the held steps were no longer as killed.
    env = child_env(
        ENGINE_CLAIM_BATCH="4",
        ENGINE_FAIR_SLICE="60",
        ENGINE_BURST_SECONDS="60",
        ENGINE_LEASE_SECONDS="600",
        ENGINE_CLAIM_BATCH_HOLD_SECONDS="300",
        KILL_WORKER="1",
        PYTHON_TOOL_ALLOWLIST=",".join(settings.PYTHON_TOOL_ALLOWLIST),
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(run.pk)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
    )

    assert child.returncode == -signal.SIGKILL, child.stdout.decode(errors="replace")
    held = {"killer", "s2", "s3", "s4"}
    steps = steps_of(run)
    assert steps["s0"].status == "completed"
    assert {(steps[name].status, steps[name].celery_task_id) for name in held} == {
        ("running", "bell-victim")
    }

    # Their leases lapse (as ten minutes later), and beat sends the sweep.
    lapsed = timezone.now() - timedelta(seconds=1)
    Step.objects.filter(run=run, name__in=held).update(lease_expires_at=lapsed)
    assert sweeps.reclaim_expired_leases() == {"reclaimed": 4, "failed": 0}

    steps = steps_of(run)
    assert {(steps[name].status, steps[name].reclaims) for name in held} == {("pending", 1)}
    assert serve(run) == 9
    steps = steps_of(run)
    again = {name: s.attempts for name, s in steps.items() if s.attempts != 1}
    assert again == dict.fromkeys(held, 2)
    assert_ran_once(run)


def test_another_organizations_run_is_served_while_a_batched_run_has_steps_left(
    settings: SettingsWrapper, rings: list[tuple[str, str]], kept: list[int]
) -> None:
    # One server, two organizations: the wide run is served in batches, and once its
    # slice is over the recording makes the fair choice instead of claiming a batch, so
    # the other organization's small run is served long before the wide one ends.
    settings.ENGINE_FAIR_SLICE = 0.05
    wide = started(*noops(*(f"w{i}" for i in range(60))))
    spec = factories.plan(steps=3)
    small = services.run_create(organization=factories.org(), plan=spec)
    run_start(run_id=small.pk)
    assert control.pick_up(small.pk)

    assert serve(wide) == 63

    assert kept
    assert max(kept) == 3
    wide.refresh_from_db()
    small.refresh_from_db()
    assert small.completed_at is not None
    assert wide.completed_at is not None
    assert small.completed_at < wide.completed_at
    last_of_small = small.completed_at
    after_small = Step.objects.filter(run=wide, completed_at__gt=last_of_small).count()
    assert after_small > 0, "the small run waited for the whole wide run"
    assert_ran_once(wide)
    assert_ran_once(small)
