"""The run's page in the admin (laid out by ``layout``, drawn by ``svg``, beside it), the
live endpoint it polls, and its controls, each the API's service with the operator as
the actor (the list's bulk actions use them too)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from billing.services import InsufficientCredits
from common.admin import actor_of
from runs import services
from runs.admin.run_page import layout, svg
from runs.admission import run_admission
from runs.models import Run, Step
from runs.people import approvals, escalations
from runs.selectors import event_label
from runs.states import RUN_TRANSITIONS, InvalidTransition, RunStatus

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
    run_admission.TooManyPendingRuns,
    approvals.NothingWaiting,
    services.StepNotFound,
)


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


def offered(run: Run, waiting: bool) -> set[str]:
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


class RunPageAdmin(admin.ModelAdmin[Run]):
    """The run page's views; ``RunAdmin`` adds the list, the fields and the bulk actions."""

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
        control buttons and the event log (``layout``) above the run's fields (the
        run the change view has already read and checked)."""
        if obj is not None:
            run = obj
            before = request.GET.get("events_before", "")
            page = layout.run_page(run)
            events, older = layout.event_page(run, int(before) if before.isdigit() else None)
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
                    if name in offered(run, bool(page.waiting))
                ],
                can_control=self.has_change_permission(request, run),
                palette=svg.PALETTE,
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def live_view(self, request: HttpRequest, run_id: Any) -> JsonResponse:
        """What the run page polls every two seconds while the run is live."""
        return JsonResponse(layout.run_live(self._run_or_404(request, run_id)))

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
            actor = actor_of(request)
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
