"""Fair sharing of the workers between organizations (``runs.admission.fairness``)."""

from __future__ import annotations

from django.db import models

from billing.models import Organization

# --------------------------------------------------------------------------- fairness
# Fair sharing of the workers between organizations (runs.fairness; docs/fairness.md).


class FairTurn(models.Model):
    """When fair dispatch last gave an organization a worker: organizations as loaded
    as each other are served in turn, the longest waiting first."""

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    served_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.organization_id} served at {self.served_at}"


class StepSlot(models.Model):
    """One of an organization's ``max_running_steps`` slots: a worker holds one while it
    executes that organization's steps, so that no more than that many execute at once.
    A holder that died lets its slot go when ``expires_at`` passes."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    slot = models.PositiveIntegerField()
    holder = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "slot"], name="stepslot_unique"),
        ]

    def __str__(self) -> str:
        return f"slot {self.slot} of {self.organization_id} ({self.holder or 'free'})"
