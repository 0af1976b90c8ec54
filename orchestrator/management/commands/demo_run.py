"""`python manage.py demo_run`: submit a demonstration run and follow it to the end.

The plan has a sequential task, a parallel fan-out, a small DAG of tasks, a step that
fails once and succeeds on retry, and a tool chain that passes outputs along through
templates (no LLM needed). Progress is printed until the run ends, then the credits
reserved, charged and refunded. `make run` calls it once the stack is healthy, with
`--id-file`, and links to the run's page in its banner.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from billing.models import Organization
from billing.services import credits_grant, organization_create
from runs import services
from runs.engine.start import run_start
from runs.models import Run, RunAttempt, Step
from runs.states import RUN_TERMINAL

DEMO_ORGANIZATION = "demo"


def demo_plan() -> dict[str, Any]:
    def noop(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "tool": "noop", **extra}

    return {
        "name": "demo: research pipeline",
        "priority": 3,
        "variables": {"topic": "AI chips", "words": "fast cheap accurate"},
        "agents": [
            {
                "name": "researcher",
                "mode": "dag",
                "max_concurrent_tasks": 3,
                "tasks": [
                    {
                        "name": "prepare",
                        "mode": "sequential",
                        "steps": [
                            {
                                "name": "topic",
                                "tool": "echo",
                                "params": {"topic": "${variables.topic}"},
                            },
                            {
                                "name": "count",
                                "tool": "python",
                                "params": {
                                    "callable": "orchestrator.tools.examples.word_count",
                                    "kwargs": {"text": "${variables.words}"},
                                },
                            },
                            {
                                "name": "flaky-fetch",
                                "tool": "fail",
                                "params": {"code": "service_unavailable", "until_attempt": 1},
                                "retry": {
                                    "max_attempts": 3,
                                    "backoff": "exponential",
                                    "base_delay_ms": 200,
                                },
                            },
                        ],
                    },
                    {
                        "name": "gather",
                        "mode": "parallel",
                        "max_concurrent_steps": 4,
                        "depends_on": ["prepare"],
                        "steps": [noop(f"source-{i}") for i in range(8)],
                    },
                    {
                        "name": "analyse",
                        "depends_on": ["prepare"],
                        "steps": [{"name": "think", "tool": "sleep", "params": {"seconds": 0.5}}],
                    },
                    {
                        "name": "report",
                        "depends_on": ["gather", "analyse"],
                        "steps": [
                            {
                                "name": "summary",
                                "tool": "echo",
                                "params": {
                                    "topic": "${tasks.prepare.steps.topic.output.topic}",
                                    "words": "${tasks.prepare.steps.count.output.words}",
                                    "gathered": "${tasks.gather.status}",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }


class Command(BaseCommand):
    help = "Submit a demo run (sequential, parallel, DAG, a retried step) and follow it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=120.0)
        parser.add_argument(
            "--id-file", type=Path, help="write the run's id here as soon as it is submitted"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        organization = Organization.objects.filter(name=DEMO_ORGANIZATION).first()
        if organization is None:
            organization = organization_create(name=DEMO_ORGANIZATION)
        if organization.credits_available < 10:
            credits_grant(
                organization=organization, amount=100, reason="demo credits", actor="demo"
            )
        run = services.run_create(organization=organization, plan=demo_plan(), actor="demo")
        run = run_start(run_id=run.pk, actor="demo")
        if options["id_file"]:
            options["id_file"].write_text(f"{run.pk}\n")
        page = reverse("admin:runs_run_change", args=[run.pk])
        self.stdout.write(f"demo run {run.pk} started ({page}); following it")
        deadline = time.monotonic() + options["timeout"]
        last = ""
        while True:
            run = Run.objects.get(pk=run.pk)
            counts = Counter(
                Step.objects.filter(run=run, attempt_number=run.attempt_number).values_list(
                    "status", flat=True
                )
            )
            line = f"  {run.status:<17} steps: " + ", ".join(
                f"{n} {status}" for status, n in sorted(counts.items())
            )
            if line != last:
                self.stdout.write(line)
                last = line
            if run.status in RUN_TERMINAL:
                break
            if time.monotonic() > deadline:
                raise CommandError(
                    f"demo run {run.pk} still {run.status} after {options['timeout']}s"
                )
            time.sleep(0.2)  # following another process's progress for a person to read
        attempt = RunAttempt.objects.get(run=run, attempt_number=run.attempt_number)
        flaky = Step.objects.get(run=run, name="flaky-fetch", attempt_number=run.attempt_number)
        summary = Step.objects.get(run=run, name="summary", attempt_number=run.attempt_number)
        self.stdout.write(
            f"demo run {run.status} in {run.duration_ms} ms; flaky-fetch took {flaky.attempts} "
            f"attempts; summary output: {summary.output}"
        )
        self.stdout.write(
            f"credits: reserved {attempt.reservation.reserved}, "
            f"charged {attempt.reservation.charged}, refunded {attempt.reservation.refunded}"
        )
        if run.status != "completed":
            raise CommandError(f"demo run ended {run.status}: {run.last_error}")
