"""The run services at the state level: what each operation does, and refuses."""

from __future__ import annotations

import pytest

from common.invariants import violations
from runs import services
from runs.engine.start import run_start
from runs.models import Agent, HistoryEvent, Run, RunAttempt, Step, Task
from runs.people import approvals
from runs.selectors import run_history
from runs.states import InvalidTransition
from runs.transitions import transition
from tests import factories
from tests.factories import finish_all_work

pytestmark = pytest.mark.django_db


def assert_invariants_hold() -> None:
    broken = violations()
    assert broken == {}


def started(**plan_options: object) -> Run:
    run = factories.run(**plan_options)  # type: ignore[arg-type]
    run_start(run_id=run.pk)
    picked, _ = services.run_pick_up(run_id=run.pk)
    return picked


def test_create_stores_the_spec_as_submitted_and_no_agents() -> None:
    organization = factories.org()
    spec = factories.plan(name="research", priority=2)

    run = services.run_create(organization=organization, plan=spec, actor="api:test")

    assert (run.status, run.priority, run.attempt_number, run.agent_count) == ("created", 2, 0, 0)
    assert Run.objects.get(pk=run.pk).plan == spec
    assert not Agent.objects.filter(run=run).exists()
    assert list(run_history(run).values_list("kind", flat=True)) == ["created"]
    assert_invariants_hold()


def test_start_opens_attempt_one_and_is_idempotent() -> None:
    run = factories.run()

    first = run_start(run_id=run.pk)
    again = run_start(run_id=run.pk)

    assert first.status == again.status == "pending"
    assert first.started_at is not None
    assert RunAttempt.objects.filter(run=run).count() == 1
    assert run_history(run).filter(to_status="pending").count() == 1
    assert not Agent.objects.filter(run=run).exists()  # none before pick-up
    assert_invariants_hold()


def test_pick_up_materialises_the_plan_once() -> None:
    run = factories.run(agents=2, tasks=3, steps=4)
    run_start(run_id=run.pk)

    picked, did_pick = services.run_pick_up(run_id=run.pk)
    again, did_again = services.run_pick_up(run_id=run.pk)

    assert (did_pick, did_again) == (True, False)
    assert picked.status == again.status == "running"
    assert picked.agent_count == 2
    assert Task.objects.filter(run=run).count() == 6
    assert Step.objects.filter(run=run).count() == 24
    assert set(Task.objects.filter(run=run).values_list("step_count", flat=True)) == {4}
    assert picked.last_heartbeat is not None
    assert_invariants_hold()


def test_pick_up_of_a_run_cancelled_while_queued_does_nothing() -> None:
    run = factories.run()
    run_start(run_id=run.pk)
    services.run_cancel(run_id=run.pk, reason="changed my mind")

    picked, did_pick = services.run_pick_up(run_id=run.pk)

    assert did_pick is False
    assert picked.status == "cancelled"
    assert not Agent.objects.filter(run=run).exists()
    assert_invariants_hold()


def test_cancel_ends_open_work_cancelled_keeps_completed_and_records_the_reason() -> None:
    run = started(tasks=2, steps=2)
    done = Step.objects.filter(run=run).order_by("pk").first()
    assert done is not None
    transition(Step, done.pk, "running")
    transition(Step, done.pk, "completed")

    cancelled = services.run_cancel(run_id=run.pk, reason="operator request", actor="cli")
    again = services.run_cancel(run_id=run.pk, reason="twice")

    assert cancelled.status == again.status == "cancelled"
    assert cancelled.cancel_reason == "operator request"
    assert Step.objects.get(pk=done.pk).status == "completed"
    assert set(Step.objects.exclude(pk=done.pk).values_list("status", flat=True)) == {"cancelled"}
    assert set(Agent.objects.filter(run=run).values_list("status", flat=True)) == {"cancelled"}
    assert run_history(run).filter(to_status="cancelled", entity="run").count() == 1
    assert RunAttempt.objects.get(run=run).outcome == "cancelled"
    assert_invariants_hold()


def test_cancel_of_a_finished_run_is_refused_and_changes_nothing() -> None:
    run = started()
    finish_all_work(run)
    services.run_complete(run_id=run.pk)
    events = HistoryEvent.objects.count()

    with pytest.raises(InvalidTransition):
        services.run_cancel(run_id=run.pk)

    assert Run.objects.get(pk=run.pk).status == "completed"
    assert HistoryEvent.objects.count() == events


def test_complete_is_refused_while_agents_are_unfinished() -> None:
    run = started()

    with pytest.raises(InvalidTransition, match="agents have not completed"):
        services.run_complete(run_id=run.pk)

    assert Run.objects.get(pk=run.pk).status == "running"


def test_pause_holds_pending_work_and_resume_releases_it() -> None:
    run = started(steps=3)
    first = Step.objects.filter(run=run).order_by("position").first()
    assert first is not None
    transition(Step, first.pk, "running")

    paused = services.run_pause(run_id=run.pk)

    assert paused.status == "paused"
    assert Step.objects.get(pk=first.pk).status == "running"  # finishes, keeps its result
    assert set(Step.objects.exclude(pk=first.pk).values_list("status", flat=True)) == {"paused"}
    assert set(Agent.objects.filter(run=run).values_list("status", flat=True)) == {"paused"}
    assert_invariants_hold()

    resuming = services.run_resume(run_id=run.pk)
    assert resuming.status == "resuming"
    assert set(Step.objects.exclude(pk=first.pk).values_list("status", flat=True)) == {"pending"}
    running = services.run_resumed(run_id=run.pk)
    assert running.status == "running"
    assert_invariants_hold()


def test_retry_opens_a_new_attempt_and_keeps_the_old_one_intact() -> None:
    run = started(steps=2)
    first_attempt_steps = set(Step.objects.filter(run=run).values_list("pk", flat=True))
    services.run_fail(run_id=run.pk, code="tool_error", message="boom")
    snapshot = list(Step.objects.filter(run=run).values_list("pk", "status").order_by("pk"))

    retrying = services.run_retry(run_id=run.pk)
    again = services.run_retry(run_id=run.pk)
    services.run_requeue(run_id=run.pk)
    picked, _ = services.run_pick_up(run_id=run.pk)

    assert retrying.status == again.status == "retrying"
    assert picked.status == "running"
    assert picked.attempt_number == 2
    assert list(RunAttempt.objects.filter(run=run).values_list("attempt_number", "outcome")) == [
        (1, "failed"),
        (2, ""),
    ]
    assert (
        list(
            Step.objects.filter(pk__in=first_attempt_steps)
            .values_list("pk", "status")
            .order_by("pk")
        )
        == snapshot
    )
    assert Step.objects.filter(run=run, attempt_number=2).count() == 2
    assert_invariants_hold()


def test_retry_is_refused_once_attempts_are_exhausted() -> None:
    run = started(max_attempts=1)
    services.run_fail(run_id=run.pk, code="tool_error", message="boom")

    with pytest.raises(services.AttemptsExhausted):
        services.run_retry(run_id=run.pk)

    assert Run.objects.get(pk=run.pk).status == "failed"


def test_retry_of_a_run_that_did_not_fail_is_an_invalid_transition() -> None:
    run = started()

    with pytest.raises(InvalidTransition):
        services.run_retry(run_id=run.pk)


def _waiting_for_approval(run: Run) -> Step:
    step = Step.objects.filter(run=run).order_by("position").first()
    assert step is not None
    transition(Step, step.pk, "waiting_approval")
    transition(Run, run.pk, "waiting_approval")
    return step


def test_approve_completes_the_waiting_step_once() -> None:
    run = started()
    step = _waiting_for_approval(run)

    first = approvals.run_approve(run_id=run.pk, comment="ship it", actor="admin:ops")
    second = approvals.run_approve(run_id=run.pk, comment="ship it")

    assert [s.pk for s in first.steps] == [step.pk]
    assert second.changed is False
    approved = Step.objects.get(pk=step.pk)
    assert approved.status == "completed"
    assert approved.output == {"approved": True, "comment": "ship it", "by": "admin:ops"}
    assert Run.objects.get(pk=run.pk).status == "running"
    assert run_history(run).filter(kind="approval").count() == 1


def test_approve_when_nothing_waits_changes_nothing() -> None:
    run = started()
    events = HistoryEvent.objects.count()

    result = approvals.run_approve(run_id=run.pk)

    assert result.changed is False
    assert HistoryEvent.objects.count() == events
    assert Run.objects.get(pk=run.pk).status == "running"


def test_reject_fails_the_waiting_step_with_a_reason_code() -> None:
    run = started()
    step = _waiting_for_approval(run)

    approvals.run_reject(run_id=run.pk, step_id=step.pk, comment="not today")

    rejected = Step.objects.get(pk=step.pk)
    assert rejected.status == "failed"
    assert rejected.error is not None
    assert rejected.error["code"] == "approval_rejected"


def test_approve_by_a_step_of_another_run_is_not_found() -> None:
    run, other = started(), started()
    step = _waiting_for_approval(other)

    with pytest.raises(services.StepNotFound):
        approvals.run_approve(run_id=run.pk, step_id=step.pk)

    assert Step.objects.get(pk=step.pk).status == "waiting_approval"


def test_soft_delete_only_from_created() -> None:
    run = factories.run()
    deleted = services.run_delete(run_id=run.pk)

    assert deleted.status == "cancelled"
    assert deleted.deleted_at is not None
    with pytest.raises(services.RunDeleted):
        run_start(run_id=run.pk)

    other = started()
    with pytest.raises(InvalidTransition):
        services.run_delete(run_id=other.pk)
    assert Run.objects.get(pk=other.pk).deleted_at is None


def test_services_scoped_to_an_organization_do_not_see_other_tenants_runs() -> None:
    run = factories.run()
    stranger = factories.org()

    with pytest.raises(services.RunNotFound):
        services.run_cancel(run_id=run.pk, organization=stranger)

    assert Run.objects.get(pk=run.pk).status == "created"


def test_fail_records_last_error_and_fails_unfinished_agents() -> None:
    run = started(agents=2)
    agent = Agent.objects.filter(run=run).first()
    assert agent is not None
    transition(Agent, agent.pk, "running")

    failed = services.run_fail(run_id=run.pk, code="timeout", message="run timed out")

    assert failed.last_error == {"code": "timeout", "message": "run timed out"}
    assert Agent.objects.get(pk=agent.pk).status == "failed"
    assert Agent.objects.exclude(pk=agent.pk).get(run=run).status == "failed"  # never started
    assert set(Step.objects.filter(run=run).values_list("status", flat=True)) == {"cancelled"}
    assert_invariants_hold()


def test_a_paused_run_that_fails_fails_its_paused_agents() -> None:
    # Found by the state machine's property test: a run failed while paused (its timeout,
    # an operator) left its agents cancelled, a failed run with no failed agent.
    run = started(agents=2)
    services.run_pause(run_id=run.pk)
    assert set(Agent.objects.filter(run=run).values_list("status", flat=True)) == {"paused"}

    services.run_fail(run_id=run.pk, code="timeout", message="run timed out")

    assert set(Agent.objects.filter(run=run).values_list("status", flat=True)) == {"failed"}
    assert set(Step.objects.filter(run=run).values_list("status", flat=True)) == {"cancelled"}
    assert_invariants_hold()


# Free text from callers other than the API (the admin, the CLI, a tool's error) may hold
# characters PostgreSQL cannot store; the operation goes through with them replaced.
UNSTORABLE = "left\x00right \ud800"
STORED = "left\ufffdright \ufffd"


def test_a_cancel_reason_with_unstorable_characters_is_stored_readable() -> None:
    run = started()

    cancelled = services.run_cancel(run_id=run.pk, reason=UNSTORABLE)

    assert Run.objects.get(pk=cancelled.pk).cancel_reason == STORED
    event = run_history(run).get(entity="run", to_status="cancelled")
    assert (event.message, event.payload) == (STORED, {"reason": STORED})
    assert_invariants_hold()


def test_a_failure_message_with_unstorable_characters_is_stored_readable() -> None:
    run = started()

    services.run_fail(run_id=run.pk, code="tool_error", message=UNSTORABLE)

    assert Run.objects.get(pk=run.pk).last_error == {"code": "tool_error", "message": STORED}
    assert_invariants_hold()


@pytest.mark.parametrize("approve", [True, False], ids=["approve", "reject"])
def test_an_approval_comment_with_unstorable_characters_is_stored_readable(approve: bool) -> None:
    run = started()
    step = _waiting_for_approval(run)
    decide = approvals.run_approve if approve else approvals.run_reject

    decide(run_id=run.pk, comment=UNSTORABLE)

    event = run_history(run).get(kind="approval")
    assert (event.message, event.payload["comment"]) == (STORED, STORED)
    decided = Step.objects.get(pk=step.pk)
    if approve:
        assert decided.output is not None
        assert decided.output["comment"] == STORED
    else:
        assert decided.error is not None
        assert decided.error["message"] == STORED
