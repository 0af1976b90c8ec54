"""The run's page in the admin: graph, time line, progress, credits, decisions waiting,
the control buttons and the event log (laid out by ``runs.runpage``, drawn by
``runs.svg``), the live endpoint it polls and the control actions it confirms."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from runs import runpage, svg
from runs.admin.controls import CONTROLS, REFUSALS, actor_of, offered
from runs.models import Run, Step
from runs.selectors import event_label


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
                    if name in offered(run, bool(page.waiting))
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
