"""Operators' view of runs: find them, see the hierarchy and the history, steer them.

Everything here is read-only; the actions call the same services as the API. Pages
run a bounded number of queries whatever the size of the table (`list_select_related`,
aggregated hierarchy, a capped event list).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from billing.admin import OrganizationAdmin, OrganizationForm
from billing.models import Organization
from billing.services import InsufficientCredits
from common.admin import ReadOnlyAdminMixin
from ratelimits.models import RateLimit
from runs import (
    admission,
    approvals,
    escalations,
    fairness,
    runners,
    runpage,
    services,
    step_admission,
    svg,
)
from runs.models import (
    Agent,
    EscalationTicket,
    Notification,
    Replan,
    Resolution,
    Run,
    RunAttempt,
    RunEvent,
    Runner,
    RunnerJob,
    Step,
    StepWait,
    Task,
)
from runs.selectors import event_label, with_paths
from runs.states import RUN_TRANSITIONS, InvalidTransition, RunStatus

PLAN_SHOWN_BYTES = 100_000

# What the services refuse for a reason an operator should read (not a crash): shown as
# the admin's error message, the run untouched.
REFUSALS: tuple[type[Exception], ...] = (
    InvalidTransition,
    services.AttemptsExhausted,
    services.RunDeleted,
    InsufficientCredits,
    escalations.EscalationNotFound,
    escalations.EscalationResolved,
    escalations.ReplanLimitReached,
    admission.TooManyPendingRuns,
    approvals.NothingWaiting,
    services.StepNotFound,
)


def _actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


@dataclass(frozen=True)
class Control:
    """One of the run page's control actions: what the button and the confirmation say,
    and the service it calls (the API's, with the operator as the actor)."""

    verb: str
    question: str
    perform: Callable[[Run, str, int | None, str], Any]
    takes_step: bool = False


def _cancel(run: Run, actor: str, step_id: int | None, comment: str) -> Any:
    reason = comment or f"cancelled by {actor}"
    return services.run_cancel(run_id=run.pk, reason=reason, actor=actor)


def _decision(approve: bool) -> Callable[[Run, str, int | None, str], Any]:
    decide = approvals.run_approve if approve else approvals.run_reject

    def perform(run: Run, actor: str, step_id: int | None, comment: str) -> Any:
        result = decide(
            run_id=run.pk, step_id=step_id, comment=comment or f"by {actor} in the admin",
            actor=actor,
        )  # fmt: skip
        if not result.changed:
            raise approvals.NothingWaiting(f"no step of {run.pk} waits for approval")
        return result

    return perform


def _offered(run: Run, waiting: bool) -> set[str]:
    """The controls the run's state machine allows now (the page offers only these; the
    services still decide, a stale page is refused with the reason)."""
    allowed = RUN_TRANSITIONS.get(run.status, frozenset())
    offered = {
        name
        for name, target in (
            ("cancel", RunStatus.CANCELLED),
            ("pause", RunStatus.PAUSED),
            ("resume", RunStatus.RESUMING),
            ("retry", RunStatus.RETRYING),
        )
        if target in allowed
    }
    return offered | ({"approve", "reject"} if waiting else set())


CONTROLS: dict[str, Control] = {
    "cancel": Control("Cancel", "Cancel this run? Running steps are stopped.", _cancel),
    "pause": Control(
        "Pause",
        "Pause this run? Running steps finish; nothing new starts.",
        lambda run, actor, _s, _c: services.run_pause(run_id=run.pk, actor=actor),
    ),
    "resume": Control(
        "Resume",
        "Resume this run?",
        lambda run, actor, _s, _c: services.run_resume(run_id=run.pk, actor=actor),
    ),
    "retry": Control(
        "Retry",
        "Retry this run as a new attempt? Credits are reserved again.",
        lambda run, actor, _s, _c: services.run_retry(run_id=run.pk, actor=actor),
    ),
    "approve": Control("Approve", "Approve", _decision(True), takes_step=True),
    "reject": Control("Reject", "Reject", _decision(False), takes_step=True),
}


class RunAttemptInline(admin.TabularInline[RunAttempt, Run]):
    model = RunAttempt
    extra = 0
    can_delete = False
    fields = ("attempt_number", "created_at", "finished_at", "outcome")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin[Run]):
    list_display = (
        "name",
        "id",
        "organization",
        "status",
        "priority",
        "attempt_number",
        "created_at",
        "completed_at",
    )
    list_filter = ("status", "priority", "created_at", "completed_at")
    date_hierarchy = "created_at"
    search_fields = ("=id", "name")
    list_select_related = ("organization",)
    show_full_result_count = False  # a COUNT(*) over millions of rows per page is waste
    ordering = ("-created_at",)
    inlines = (RunAttemptInline,)
    actions = (
        "cancel_runs",
        "pause_runs",
        "resume_runs",
        "retry_runs",
        "start_runs",
        "approve_runs",
        "reject_runs",
        "escalate_runs",
        "resolve_resume",
        "resolve_retry",
        "resolve_replan",
        "resolve_cancel",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "name",
                    "organization",
                    "status",
                    "priority",
                    "failure_mode",
                    "mode",
                    "attempt_number",
                    "max_attempts",
                    "agent_count",
                    "last_error",
                    "cancel_reason",
                    "created_by",
                    "replan_count",
                    "open_escalation",
                    "queued_reason",
                    "concurrency_key",
                    "concurrency_max",
                    "admitted_at",
                )
            },
        ),
        (
            "Parent and children",
            {"fields": ("parent_run", "parent_step", "parent_mode", "depth", "child_runs")},
        ),
        (
            "Time",
            {
                "fields": (
                    "created_at",
                    "started_at",
                    "picked_up_at",
                    "completed_at",
                    "cancelled_at",
                    "duration_ms",
                    "last_heartbeat",
                    "deleted_at",
                )
            },
        ),
        ("Artifacts", {"fields": ("artifact_list",)}),
        ("Hierarchy (current attempt)", {"fields": ("hierarchy",)}),
        ("Plan", {"classes": ("collapse",), "fields": ("plan_json",)}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Run | None = None) -> list[str]:
        fields: list[str] = []
        for _, options in self.fieldsets:
            fields.extend(options["fields"])  # type: ignore[arg-type]
        return fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are created from a validated plan, through the API or CLI

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # audit: runs are cancelled or soft-deleted, never removed

    @admin.display(description="plan")
    def plan_json(self, run: Run) -> SafeString:
        """The plan as submitted, indented; a big one cut at PLAN_SHOWN_BYTES (a 20,000-step
        plan is megabytes of page for a field people rarely open: the API has it whole)."""
        text = json.dumps(run.plan, indent=2, ensure_ascii=False)
        if len(text) <= PLAN_SHOWN_BYTES:
            return format_html("<pre>{}</pre>", text)
        return format_html(
            "<pre>{}\n...</pre><p>The first {} KB of {} KB: the whole plan is the run's "
            "<code>plan</code> in <code>GET /api/v1/runs/{}</code>.</p>",
            text[:PLAN_SHOWN_BYTES],
            PLAN_SHOWN_BYTES // 1000,
            len(text) // 1000,
            run.pk,
        )

    @admin.display(description="child runs")
    def child_runs(self, run: Run) -> SafeString:
        """The runs its `run` steps started, linked (at most 100)."""
        children = list(
            Run.objects.filter(parent_run=run)
            .order_by("created_at")
            .values_list("pk", "name", "status", "parent_mode")[:100]
        )
        if not children:
            return format_html("<em>{}</em>", "none")
        return format_html_join(
            mark_safe("<br>"),
            '<a href="{}">{}</a> {} ({})',
            (
                (reverse("admin:runs_run_change", args=[pk]), name, status, mode)
                for pk, name, status, mode in children
            ),
        )

    @admin.display(description="artifacts")
    def artifact_list(self, run: Run) -> SafeString:
        """A link to the run's artifacts in their own admin (name, size, expiry and a
        download through the API's checks). By URL, not import: artifacts is the layer
        above runs."""
        url = reverse("admin:artifacts_artifact_changelist")
        return format_html('<a href="{}?q={}">the artifacts of this run</a>', url, run.pk)

    @admin.display(description="hierarchy")
    def hierarchy(self, run: Run) -> SafeString:
        """Agents, their tasks, and step counts by status: three queries for any size."""
        agents = list(
            Agent.objects.filter(run=run, attempt_number=run.attempt_number).order_by("position")
        )
        if not agents:
            return format_html("<em>{}</em>", "no agents yet (materialised at pick-up)")
        tasks: dict[int, list[Task]] = defaultdict(list)
        for task in Task.objects.filter(agent__in=agents).order_by("generation", "position"):
            tasks[task.agent_id].append(task)
        counts: dict[int, Counter[str]] = defaultdict(Counter)
        step_rows = (
            Step.objects.filter(task__agent__in=agents)
            .values("task_id", "status")
            .annotate(n=Count("*"))
            .order_by()
        )
        for row in step_rows:
            counts[row["task_id"]][row["status"]] = row["n"]
        rows = []
        for agent in agents:
            rows.append((f"agent {agent.name}", agent.status, agent.mode, ""))
            for task in tasks[agent.pk]:
                summary = ", ".join(f"{n} {s}" for s, n in sorted(counts[task.pk].items()))
                label = f"    task {task.name}" + (
                    f" (gen {task.generation})" if task.generation else ""
                )
                rows.append((label, task.status, task.mode, summary))
        body = format_html_join(
            "",
            "<tr><td style='white-space:pre'>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            rows,
        )
        return format_html(
            "<table><tr><th>node</th><th>status</th><th>mode</th><th>steps</th></tr>{}</table>",
            body,
        )

    # ------------------------------------------------------------- the live run page
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<uuid:run_id>/live/", wrap(self.live_view), name="runs_run_live"),
            path(
                "<uuid:run_id>/control/<str:action>/",
                wrap(self.control_view),
                name="runs_run_control",
            ),
            *super().get_urls(),
        ]

    def _run_or_404(self, request: HttpRequest, run_id: Any) -> Run:
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise Http404(f"run {run_id} not found")
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        return run

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Run | None = None,
    ) -> HttpResponse:
        """The run's page: graph, time line, progress, credits, decisions waiting, the
        control buttons and the event log (``runs.runpage``) above the run's fields (the
        run the change view has already read and checked)."""
        if obj is not None:
            run = obj
            before = request.GET.get("events_before", "")
            page = runpage.run_page(run)
            events, older = runpage.event_page(run, int(before) if before.isdigit() else None)
            context.update(
                page=page,
                graph_svg=svg.graph_svg(page.graph),
                gantt_svg=svg.gantt_svg(page.gantt),
                events=[(event, event_label(event)) for event in events],
                events_older=older,
                events_paged=before.isdigit(),
                live_url=reverse("admin:runs_run_live", args=[run.pk]),
                controls=[
                    (name, control.verb, reverse("admin:runs_run_control", args=[run.pk, name]))
                    for name, control in CONTROLS.items()
                    if name in _offered(run, bool(page.waiting))
                ],
                can_control=self.has_change_permission(request, run),
                palette=svg.PALETTE,
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def live_view(self, request: HttpRequest, run_id: Any) -> JsonResponse:
        """What the run page polls every two seconds while the run is live."""
        return JsonResponse(runpage.run_live(self._run_or_404(request, run_id)))

    def control_view(self, request: HttpRequest, run_id: Any, action: str) -> HttpResponse:
        """A control action from the run page: GET asks for confirmation, POST does it
        through the service the API calls, as ``admin:<username>``, and goes back to the
        page with what happened."""
        run = self._run_or_404(request, run_id)
        control = CONTROLS.get(action)
        if control is None:
            raise Http404(f"no action {action!r}")
        if not self.has_change_permission(request, run):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        raw_step = source.get("step_id", "")
        step_id = int(raw_step) if control.takes_step and raw_step.isdigit() else None
        back = reverse("admin:runs_run_change", args=[run.pk])
        step_path = ""
        if step_id is not None:
            step = Step.objects.filter(run=run, pk=step_id).select_related("task__agent").first()
            if step is None:
                raise Http404(f"step {step_id} is not part of run {run.pk}")
            step_path = f"{step.task.agent.name}.{step.task.name}.{step.name}"
        if request.method == "POST":
            actor = _actor(request)
            comment = request.POST.get("comment", "").strip()[:2000]
            try:
                control.perform(run, actor, step_id, comment)
            except REFUSALS as exc:
                self.message_user(request, f"{control.verb}: refused: {exc}", messages.ERROR)
            else:
                what = f"step {step_path}" if step_path else "run"
                self.message_user(request, f"{control.verb}: done ({what}, as {actor})")
            return HttpResponseRedirect(back)
        question = control.question
        if control.takes_step:
            target = f"step {step_path}" if step_path else "every step waiting for approval"
            question = f"{control.verb} {target} of this run?"
        context = {
            **self.admin_site.each_context(request),
            "title": f"{control.verb} run {run.name}?",
            "run": run,
            "opts": self.model._meta,
            "verb": control.verb,
            "question": question,
            "step_id": step_id,
            "back": back,
        }
        return TemplateResponse(request, "admin/runs/run/confirm_control.html", context)

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[Run],
        verb: str,
        operation: Callable[[Run], Any],
    ) -> None:
        done, refused = 0, []
        for run in queryset:
            try:
                operation(run)
                done += 1
            except REFUSALS as exc:
                refused.append(f"{run.name}: {exc}")
        if done:
            self.message_user(request, f"{verb}: {done} run(s)")
        for message in refused:
            self.message_user(request, message, messages.ERROR)

    @admin.action(description="Cancel selected runs")
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._control(request, queryset, "cancelled", "cancel")

    @admin.action(description="Pause selected runs")
    def pause_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._control(request, queryset, "paused", "pause")

    @admin.action(description="Resume selected runs")
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._control(request, queryset, "resumed", "resume")

    @admin.action(description="Retry selected failed runs")
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._control(request, queryset, "retried", "retry")

    @admin.action(description="Approve the steps waiting for approval in selected runs")
    def approve_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._control(request, queryset, "approved", "approve")

    @admin.action(description="Reject the steps waiting for approval in selected runs")
    def reject_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._control(request, queryset, "rejected", "reject")

    def _control(self, request: HttpRequest, queryset: QuerySet[Run], verb: str, name: str) -> None:
        """One of the run page's controls on each selected run, with its defaults (no
        comment; approve and reject: every step waiting, a run with none named)."""
        actor = _actor(request)
        perform = CONTROLS[name].perform
        self._apply(request, queryset, verb, lambda run: perform(run, actor, None, ""))

    @admin.action(description="Escalate selected running runs to people")
    def escalate_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        actor = _actor(request)
        self._apply(
            request,
            queryset,
            "escalated",
            lambda run: escalations.escalation_open(
                run_id=run.pk, actor=actor, note=f"escalated by {actor}"
            ),
        )

    def _resolve(self, request: HttpRequest, queryset: QuerySet[Run], action: str) -> None:
        """Resolve the open escalation of each run (as the API and the ticket's page do)."""
        actor = _actor(request)

        def resolve(run: Run) -> Any:
            ticket = EscalationTicket.objects.filter(run=run).exclude(status="resolved").first()
            if ticket is None:
                raise escalations.EscalationNotFound(f"run {run.pk} has no open escalation")
            return escalations.escalation_resolve(ticket_id=ticket.pk, action=action, actor=actor)

        self._apply(request, queryset, f"resolved ({action})", resolve)

    @admin.action(description="Resolve escalation: resume")
    def resolve_resume(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._resolve(request, queryset, Resolution.RESUME)

    @admin.action(description="Resolve escalation: retry (a new attempt)")
    def resolve_retry(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._resolve(request, queryset, Resolution.RETRY)

    @admin.action(description="Resolve escalation: re-plan")
    def resolve_replan(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._resolve(request, queryset, Resolution.REPLAN)

    @admin.action(description="Resolve escalation: cancel")
    def resolve_cancel(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._resolve(request, queryset, Resolution.CANCEL)

    @admin.display(description="open escalation")
    def open_escalation(self, run: Run) -> SafeString:
        ticket = EscalationTicket.objects.filter(run=run).exclude(status="resolved").first()
        if ticket is None:
            return format_html("<em>{}</em>", "none")
        url = reverse("admin:runs_escalationticket_change", args=[ticket.pk])
        return format_html('<a href="{}">{} ({})</a>', url, ticket.reason, ticket.status)

    @admin.action(description="Start selected created runs")
    def start_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        actor = _actor(request)
        self._apply(
            request, queryset, "started", lambda run: services.run_start(run_id=run.pk, actor=actor)
        )


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[RunEvent]):
    list_display = (
        "created_at",
        "run",
        "attempt_number",
        "what",
        "kind",
        "from_status",
        "to_status",
        "actor",
        "message",
    )
    list_filter = ("kind", "entity", "created_at")
    list_select_related = ("run",)
    search_fields = ("=run__id", "=entity_id")
    ordering = ("-id",)
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[RunEvent]:
        return with_paths(super().get_queryset(request))

    @admin.display(description="what")
    def what(self, event: RunEvent) -> str:
        """The entity by its path in the plan (``agent.task.step``, and a step's
        attempt), not its database id."""
        return event_label(event)


@admin.register(Runner)
class RunnerAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Runner]):
    """Registered runners (docs/runners.md): online, stale or deregistered."""

    list_display = (
        "id",
        "organization",
        "hostname",
        "project_dir",
        "executor_type",
        "status",
        "last_heartbeat",
        "registered_at",
    )
    list_filter = ("executor_type",)
    search_fields = ("=id", "hostname", "project_dir")
    list_select_related = ("organization",)
    ordering = ("organization", "hostname", "project_dir")

    @admin.display(description="status")
    def status(self, runner: Runner) -> str:
        return runners.runner_status(runner)


@admin.register(RunnerJob)
class RunnerJobAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[RunnerJob]):
    """Runner jobs, one per attempt of a `runner` step; stopping one goes through the
    service the API uses."""

    list_display = (
        "id",
        "run",
        "step",
        "attempt",
        "status",
        "runner",
        "created_at",
        "claimed_at",
        "completed_at",
    )
    list_filter = ("status", "created_at")
    list_select_related = ("run", "step", "runner")
    search_fields = ("=id", "=run__id", "=session_id")
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("stop_jobs",)

    @admin.action(description="Stop selected runner jobs")
    def stop_jobs(self, request: HttpRequest, queryset: QuerySet[RunnerJob]) -> None:
        stopped = 0
        for job in queryset:
            try:
                runners.stop_job(organization=job.organization, job_id=job.pk)
                stopped += 1
            except InvalidTransition as exc:
                self.message_user(request, f"job {job.pk}: {exc}", messages.ERROR)
        if stopped:
            self.message_user(request, f"stopping: {stopped} job(s)")


@admin.register(StepWait)
class StepWaitAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[StepWait]):
    """Callback and poll waits, one per attempt of a `callback` or `poll` step."""

    list_display = ("id", "kind", "run", "step", "attempt", "status", "polls", "expires_at")
    list_filter = ("kind", "status", "created_at")
    list_select_related = ("run", "step")
    search_fields = ("=id", "=run__id")
    ordering = ("-created_at",)
    show_full_result_count = False
    exclude = ("token_digest",)


class NotificationInline(admin.TabularInline[Notification, EscalationTicket]):
    model = Notification
    extra = 0
    can_delete = False
    fields = ("created_at", "channel", "attempt", "target", "delivered", "status_code", "error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(EscalationTicket)
class EscalationTicketAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[EscalationTicket]):
    """Runs handed to people (docs/escalation.md): acknowledge, then resolve with an
    action, through the services the API calls."""

    list_display = (
        "opened_at",
        "run",
        "organization",
        "reason",
        "severity",
        "status",
        "resolution",
        "acknowledged_by",
        "resolved_by",
        "notified_at",
    )
    list_filter = ("status", "reason", "severity", "resolution", "opened_at")
    list_select_related = ("run", "organization")
    search_fields = ("=id", "=run__id")
    ordering = ("-opened_at",)
    show_full_result_count = False
    inlines = (NotificationInline,)
    actions = (
        "acknowledge",
        "resolve_resume",
        "resolve_retry",
        "resolve_replan",
        "resolve_cancel",
    )

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[EscalationTicket],
        verb: str,
        act: Callable[[EscalationTicket, str], Any],
    ) -> None:
        actor = _actor(request)
        done = 0
        for ticket in queryset:
            try:
                act(ticket, actor)
                done += 1
            except (
                InvalidTransition,
                services.AttemptsExhausted,
                InsufficientCredits,
                escalations.EscalationResolved,
                escalations.ReplanLimitReached,
            ) as exc:
                self.message_user(request, f"escalation {ticket.pk}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{verb}: {done} escalation(s)")

    @admin.action(description="Acknowledge selected escalations")
    def acknowledge(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._each(
            request,
            queryset,
            "acknowledged",
            lambda ticket, actor: escalations.escalation_acknowledge(
                ticket_id=ticket.pk, actor=actor
            ),
        )

    def _resolve(
        self, request: HttpRequest, queryset: QuerySet[EscalationTicket], action: str
    ) -> None:
        self._each(
            request,
            queryset,
            f"resolved ({action})",
            lambda ticket, actor: escalations.escalation_resolve(
                ticket_id=ticket.pk, action=action, actor=actor
            ),
        )

    @admin.action(description="Resolve: resume (failed steps retried afresh)")
    def resolve_resume(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.RESUME)

    @admin.action(description="Resolve: retry (a new attempt of the run)")
    def resolve_retry(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.RETRY)

    @admin.action(description="Resolve: re-plan the failing agents")
    def resolve_replan(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.REPLAN)

    @admin.action(description="Resolve: cancel the run (and refund)")
    def resolve_cancel(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.CANCEL)


@admin.register(Replan)
class ReplanAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Replan]):
    """Re-plans: what failed, what the planner proposed, what came of it."""

    list_display = (
        "requested_at",
        "run",
        "number",
        "trigger",
        "planner",
        "status",
        "agents",
        "cost",
        "finished_at",
    )
    list_filter = ("status", "trigger", "planner", "requested_at")
    list_select_related = ("run",)
    search_fields = ("=run__id",)
    ordering = ("-requested_at",)
    show_full_result_count = False


# --------------------------------------------------------------------------- organizations
# The organization's page as billing draws it, with what runs adds: its limits (set
# through ``runs.admission.limits_set``) and how much of them is in use.
class OrganizationLimitsForm(OrganizationForm):
    max_running_runs = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Runs running at once; more wait (PENDING, with a queued reason). "
        "Empty: ORG_MAX_RUNNING_RUNS.",
    )
    max_running_steps = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Steps executing at once across its runs. Empty: ORG_MAX_RUNNING_STEPS.",
    )
    max_pending_runs = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Runs waiting to start; one more is refused (429). Empty: ORG_MAX_PENDING_RUNS.",
    )
    share = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        initial=1,
        help_text="Its weight when organizations share the workers (2: twice the share of "
        "1). Empty: 1.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            for name in admission.LIMIT_FIELDS:
                self.fields[name].initial = getattr(self.instance, name)


class OrganizationLoadAdmin(OrganizationAdmin):
    form = OrganizationLimitsForm
    list_display = (
        "name",
        "id",
        "credits_available",
        "runs_running",
        "runs_queued",
        "steps_executing",
        "webhook",
        "created_at",
    )
    readonly_fields = (
        *OrganizationAdmin.readonly_fields,
        "runs_running",
        "runs_queued",
        "steps_executing",
    )
    fieldsets = (
        *OrganizationAdmin.fieldsets,
        (
            "Limits and fair share (docs/fairness.md)",
            {
                "fields": (
                    *admission.LIMIT_FIELDS,
                    "runs_running",
                    "runs_queued",
                    "steps_executing",
                )
            },
        ),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Organization]:
        return fairness.with_load(super().get_queryset(request))

    def save_model(self, request: HttpRequest, obj: Organization, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        data = form.cleaned_data
        admission.limits_set(
            obj.pk,
            actor=_actor(request),
            max_running_runs=data.get("max_running_runs"),
            max_running_steps=data.get("max_running_steps"),
            max_pending_runs=data.get("max_pending_runs"),
            share=data.get("share") or 1,
        )

    @admin.display(description="runs running", ordering="runs_running")
    def runs_running(self, organization: Organization) -> int:
        return int(getattr(organization, "runs_running", 0))

    @admin.display(description="runs queued", ordering="runs_queued")
    def runs_queued(self, organization: Organization) -> int:
        return int(getattr(organization, "runs_queued", 0))

    @admin.display(description="steps executing")
    def steps_executing(self, organization: Organization) -> int:
        return int(getattr(organization, "steps_executing", 0))


admin.site.unregister(Organization)
admin.site.register(Organization, OrganizationLoadAdmin)


# --------------------------------------------------------------------------- rate limits
@admin.register(RateLimit)
class RateLimitAdmin(admin.ModelAdmin[RateLimit]):
    """Organizations' limits and the operators' global limits on a tool (no organization,
    a tool named): saving or deleting one re-plans the steps waiting for it
    (``runs.step_admission``), as the API does."""

    list_display = ("name", "organization", "tool", "limit", "period_ms", "waiting", "updated_at")
    list_filter = ("organization",)
    search_fields = ("name", "tool")
    fields = ("organization", "name", "tool", "limit", "period_ms")

    @admin.display(description="steps waiting")
    def waiting(self, limit: RateLimit) -> int:
        reason = step_admission.WAITING_PREFIX + (
            f"tool:{limit.tool}" if limit.tool else limit.name
        )
        return Step.objects.filter(status="pending", waiting_reason=reason).count()

    def save_model(self, request: HttpRequest, obj: RateLimit, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        step_admission.limit_saved(obj)

    def delete_model(self, request: HttpRequest, obj: RateLimit) -> None:
        super().delete_model(request, obj)
        step_admission.limit_saved(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RateLimit]) -> None:
        removed = list(queryset)
        super().delete_queryset(request, queryset)
        for limit in removed:
            step_admission.limit_saved(limit)
