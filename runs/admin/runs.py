"""Runs in the admin: the list, the fields, the hierarchy, the bulk actions (each the
API's service), and the event history. The run's own page is ``run_page``."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from common.admin import ReadOnlyAdminMixin, actor_of
from common.units import duration_text
from runs.admin.run_page.view import CONTROLS, REFUSALS, RunPageAdmin
from runs.engine.start import run_start
from runs.models import (
    Agent,
    EscalationTicket,
    HistoryEvent,
    Resolution,
    Run,
    RunAttempt,
    RunEvent,
    Step,
    Task,
)
from runs.people import escalations
from runs.selectors import event_label, run_history, with_paths

PLAN_SHOWN_BYTES = 100_000


class RunAttemptInline(admin.TabularInline[RunAttempt, Run]):
    model = RunAttempt
    extra = 0
    can_delete = False
    fields = ("attempt_number", "created_at", "finished_at", "outcome")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(RunPageAdmin):
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
                    "duration",
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

    @admin.display(description="duration")
    def duration(self, run: Run) -> str:
        return "-" if run.duration_ms is None else duration_text(run.duration_ms)

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
        actor = actor_of(request)
        perform = CONTROLS[name].perform
        self._apply(request, queryset, verb, lambda run: perform(run, actor, None, ""))

    @admin.action(description="Escalate selected running runs to people")
    def escalate_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        actor = actor_of(request)
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
        actor = actor_of(request)

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
        actor = actor_of(request)
        self._apply(request, queryset, "started", lambda run: run_start(run_id=run.pk, actor=actor))


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[RunEvent]):
    """A run's events as every reader lists them: its history (``selectors.run_history``),
    the event rows and the events kept on its steps' rows, under the events' own address.
    One run at a time (its page links here; or search by its id): a step's kept events
    are found by run, and a list of every run's would read every step."""

    list_display = (
        "created_at",
        "run",
        "what",
        "kind",
        "transition",
        "actor",
        "message",
    )
    list_filter = ("kind", "entity", "created_at")
    list_select_related = ("run",)
    search_fields = ("=run__id", "=entity_id")
    ordering = ("-id",)
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[RunEvent]:
        run_id = _chosen_run(request)
        history = with_paths(run_history(run_id)) if run_id else HistoryEvent.objects.none()
        # The history's rows are shown as the events' (their fields are the same).
        return history  # type: ignore[return-value]

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> RunEvent | None:
        """An event's own page: found in its run's history, the run being the list's it
        was opened from, or, opened by its address alone, the event row's."""
        try:
            pk = int(object_id)
        except (TypeError, ValueError):
            return None
        run_id = _chosen_run(request) or (
            RunEvent.objects.filter(pk=pk).values_list("run_id", flat=True).first()
        )
        if run_id is None:
            return None
        return with_paths(run_history(run_id)).filter(id=pk).first()  # type: ignore[return-value]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if _chosen_run(request) is None:
            messages.info(
                request,
                "Choose a run: its page links to its events, or search here by its id.",
            )
        return super().changelist_view(request, extra_context)

    @admin.display(description="what")
    def what(self, event: HistoryEvent) -> str:
        """The entity by its path in the plan (``agent.task.step``, and a step's
        attempt), not its database id."""
        return event_label(event)

    @admin.display(description="transition")
    def transition(self, event: HistoryEvent) -> str:
        return f"{event.from_status} \u2192 {event.to_status}" if event.to_status else ""


def _chosen_run(request: HttpRequest) -> UUID | None:
    """The run whose events are asked for: the list's filter by run (its page's link) or
    a search by its id; for an event's own page, the list's it was opened from."""
    kept = QueryDict(request.GET.get("_changelist_filters", ""))
    for params in (request.GET, kept):
        for value in (params.get("run__id__exact"), params.get("q")):
            try:
                return UUID(str(value).strip())
            except ValueError:
                continue
    return None
