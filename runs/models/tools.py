"""The catalogue of published tools (``runs.catalogue``)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from billing.models import Organization

# --------------------------------------------------------------------------- published tools
# Tools written with the client's ``@tool`` (docs/tools.md): each version a package of the
# fleet or an organization's ``orch worker`` published, with the JSON Schema a plan's
# steps are checked against at submission (``runs.catalogue``).


class ToolPlacement(models.TextChoices):
    FLEET = "fleet"  # installed on the Celery workers: every organization's
    WORKER = "worker"  # offered by an organization's own workers (runners)


class PublishedTool(models.Model):
    """One version of a published tool. A version's schema never changes once published
    (``digest``): a change is a new version, and the newest first published is the
    current one, that plans are checked against and jobs are made for."""

    # None: the fleet's, every organization's.
    organization = models.ForeignKey(
        Organization,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="published_tools",
    )
    name = models.CharField(max_length=64)
    version = models.CharField(max_length=40)
    placement = models.CharField(max_length=10, choices=ToolPlacement.choices)
    description = models.TextField(blank=True)
    params_schema = models.JSONField(default=dict)
    output_schema = models.JSONField(default=dict)
    # The cost rule as the tool declares it: {"credits": "0.02"}, {"computed": true}, {}.
    cost = models.JSONField(default=dict, blank=True)
    digest = models.CharField(max_length=64)
    published_at = models.DateTimeField()
    last_published_at = models.DateTimeField()
    # The fleet workers that published it at their start: {hostname: when}.
    published_by = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name", "-published_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name", "version"],
                name="publishedtool_one_per_version",
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=Q(placement__in=ToolPlacement.values),
                name="publishedtool_placement_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.version} ({self.placement})"
