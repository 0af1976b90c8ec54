"""Tenancy and money: organizations (the tenant and its credit account), API keys and
the organizations' secrets."""

from __future__ import annotations

import re
import uuid
from decimal import Decimal

from django.db import models


class Organization(models.Model):
    """A tenant. Every other row belongs to exactly one organization, directly or via its run."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The available balance, cached from the ledger and changed only in the transaction
    # that appends the entry (grant, reserve, refund; a charge draws on the attempt's
    # reservation and leaves it alone). `check_invariants` recomputes it from the ledger.
    credits_available = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    # On-call (docs/escalation.md): who is told when one of its runs escalates. The
    # webhook's signing secret is stored as a Fernet token (billing.secrets), never shown.
    escalation_webhook_url = models.URLField(max_length=1000, blank=True, db_default="")
    escalation_webhook_secret = models.BinaryField(null=True, blank=True, editable=False)
    oncall_emails = models.JSONField(default=list, blank=True, db_default=[])
    # Fair sharing (docs/fairness.md): each limit empty takes its setting (ORG_MAX_*).
    max_running_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Runs running at once; empty: ORG_MAX_RUNNING_RUNS."
    )
    max_running_steps = models.PositiveIntegerField(
        null=True, blank=True, help_text="Steps executing at once; empty: ORG_MAX_RUNNING_STEPS."
    )
    max_pending_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Runs waiting to start; empty: ORG_MAX_PENDING_RUNS."
    )
    share = models.PositiveSmallIntegerField(
        default=1,
        db_default=1,
        help_text="Its weight when organizations share the workers (2: twice the share of 1).",
    )
    # Quotas (docs/tenants.md): how many of each it may hold; empty takes its setting
    # (QUOTA_*).
    quota_webhook_endpoints = models.PositiveIntegerField(
        null=True, blank=True, help_text="Webhook endpoints; empty: QUOTA_WEBHOOK_ENDPOINTS."
    )
    quota_schedules = models.PositiveIntegerField(
        null=True, blank=True, help_text="Schedules; empty: QUOTA_SCHEDULES."
    )
    quota_rate_limits = models.PositiveIntegerField(
        null=True, blank=True, help_text="Rate limits; empty: QUOTA_RATE_LIMITS."
    )
    quota_event_streams = models.PositiveIntegerField(
        null=True, blank=True, help_text="Event streams open at once; empty: QUOTA_EVENT_STREAMS."
    )
    quota_runner_polls = models.PositiveIntegerField(
        null=True, blank=True, help_text="Runner polls held at once; empty: QUOTA_RUNNER_POLLS."
    )
    quota_webhooks_in_flight = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Webhook deliveries in flight at once; empty: QUOTA_WEBHOOKS_IN_FLIGHT.",
    )
    quota_artifacts = models.PositiveIntegerField(
        null=True, blank=True, help_text="Artifacts stored; empty: QUOTA_ARTIFACTS."
    )
    quota_artifact_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes of artifacts stored; empty: QUOTA_ARTIFACT_BYTES."
    )
    quota_parked_waits = models.PositiveIntegerField(
        null=True, blank=True, help_text="Wait steps parked at once; empty: QUOTA_PARKED_WAITS."
    )
    # Suspension (docs/tenants.md): while set, its keys are refused, its schedules skip,
    # its webhooks hold their deliveries and its running runs are paused.
    suspended_at = models.DateTimeField(null=True, blank=True, editable=False)
    suspended_reason = models.CharField(max_length=500, blank=True, db_default="")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(credits_available__gte=0), name="org_available_gte_0"
            ),
            models.CheckConstraint(condition=models.Q(share__gte=1), name="org_share_gte_1"),
        ]

    def __str__(self) -> str:
        return self.name


class ApiKeyScope(models.TextChoices):
    """What a key may do (api.permissions): a dashboard or a runner host never holds
    a key that can spend credits."""

    FULL = "full", "full: every route"
    READ = "read", "read: every GET route, nothing else"
    RUNNER = "runner", "runner: the runner routes only"


class ApiKey(models.Model):
    """A client's credential for one organization.

    Only a SHA-256 digest of the key and a short clear prefix (to recognise it in lists)
    are stored; the key itself is shown once, by ``billing.services.api_key_create``.
    A fast hash is enough: keys are 256-bit random strings, not passwords.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    scope = models.CharField(max_length=10, choices=ApiKeyScope.choices, default=ApiKeyScope.FULL)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(scope__in=ApiKeyScope.values), name="apikey_scope_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class EntryType(models.TextChoices):
    GRANT = "grant"
    RESERVE = "reserve"
    CHARGE = "charge"
    REFUND = "refund"


class LedgerEntry(models.Model):
    """One movement of credits. Append-only: a database trigger refuses UPDATE and DELETE.

    - grant: credits added to the organization (available +)
    - reserve: held for a run attempt (available -, reserved +)
    - charge: what a settled attempt's steps cost, taken from its reservation (reserved -):
      one entry per attempt, written when it settles; its steps' costs are on their rows
      (an attempt opened before that has an entry per step attempt too, ``step`` set)
    - refund: what a settled attempt did not use, back to available (reserved -)
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No single-column indexes on organization, run and attempt: the composite indexes
    # below lead with each of them. A redundant one is not only a cost on every insert (a
    # charge per step): before the table's first ANALYZE, PostgreSQL picked the
    # organization's own index for the charge's idempotency check and filtered every
    # entry of the organization by key, a cost growing with its ledger.
    # Links the database does not check (db_constraint=False): every entry is written
    # from its organization's, run's, attempt's and step's rows in the transaction that
    # holds them, and none of those is ever deleted (docs/engine.md, "Links the database
    # does not check"); check_invariants finds an orphan (billing.orphans).
    organization = models.ForeignKey(
        Organization,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        db_index=False,
        db_constraint=False,
    )
    run = models.ForeignKey(
        "runs.Run",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        db_index=False,
        db_constraint=False,
    )
    attempt = models.ForeignKey(
        "runs.RunAttempt",
        null=True,
        blank=True,
        db_index=False,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        db_constraint=False,
    )
    step = models.ForeignKey(
        "runs.Step",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        db_constraint=False,
    )
    type = models.CharField(max_length=10, choices=EntryType.choices)
    amount = models.DecimalField(max_digits=18, decimal_places=6)
    idempotency_key = models.CharField(max_length=200)
    reason = models.CharField(max_length=500, blank=True)
    actor = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "ledger entries"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["organization", "-created_at"], name="ledger_org_created"),
            models.Index(fields=["attempt", "type"], name="ledger_attempt_type"),
            models.Index(fields=["run"], name="ledger_run"),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(amount__gt=0), name="ledger_amount_positive"),
            models.UniqueConstraint(
                fields=["organization", "idempotency_key"], name="ledger_unique_key"
            ),
            models.CheckConstraint(
                condition=models.Q(type__in=EntryType.values), name="ledger_type_valid"
            ),
            # Everything but a grant belongs to a run attempt.
            models.CheckConstraint(
                condition=models.Q(type="grant")
                | models.Q(run__isnull=False, attempt__isnull=False),
                name="ledger_run_entries_have_attempt",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.amount} ({self.organization_id})"

    def save(self, *args: object, **kwargs: object) -> None:
        if not self._state.adding:
            raise ValueError("the ledger is append-only")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise ValueError("the ledger is append-only")


class Reservation(models.Model):
    """The credits held for one run attempt, and what became of them: billing's own row.

    Written only by ``billing.services`` and the credits' functions (reserve when the
    attempt opens; each step attempt's charge drawn on ``charged``, the counter the
    budget is checked against, with no ledger entry; settle when it ends, which enters
    ``charged`` in the ledger as one charge and refunds the rest). Found by the run's id
    and the attempt's number, which is what the engine knows when it charges a step;
    billing never reads the run's rows. reserved = charged + refunded + what is still
    held; nothing is held once settled.
    """

    id = models.BigAutoField(primary_key=True)
    # Links the database does not check, as the ledger's (LedgerEntry.organization).
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="reservations", db_constraint=False
    )
    run_id = models.UUIDField()
    attempt_number = models.PositiveSmallIntegerField()
    # The same attempt as a relation, for the ledger's entries and the admin.
    attempt = models.OneToOneField(
        "runs.RunAttempt", on_delete=models.PROTECT, related_name="reservation", db_constraint=False
    )
    reserved = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    charged = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    refunded = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    settled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run_id", "attempt_number"]
        constraints = [
            models.UniqueConstraint(
                fields=["run_id", "attempt_number"], name="reservation_unique_attempt"
            ),
            models.CheckConstraint(
                condition=models.Q(reserved__gte=models.F("charged") + models.F("refunded")),
                name="reservation_conserved",
            ),
            models.CheckConstraint(
                condition=models.Q(charged__gte=0), name="reservation_charged_gte_0"
            ),
            models.CheckConstraint(
                condition=models.Q(refunded__gte=0), name="reservation_refunded_gte_0"
            ),
        ]
        indexes = [models.Index(fields=["organization", "settled_at"], name="reservation_org")]

    def __str__(self) -> str:
        return f"reservation of run {self.run_id} attempt {self.attempt_number}"

    @property
    def held(self) -> Decimal:
        return Decimal(0) if self.settled_at else self.reserved - self.charged - self.refunded


# A secret's name, as plans write it in `${secrets.NAME}` (runs/plan/checks.py checks it there too).
SECRET_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,99}"  # noqa: S105 (a pattern, not a secret)
SECRET_NAME_RE = re.compile(SECRET_NAME_PATTERN)


class Secret(models.Model):
    """A value a plan may use (`${secrets.NAME}`) without ever holding it.

    Only a Fernet token of the value is stored (``billing.secrets``, keys from
    ``SECRETS_ENCRYPTION_KEYS``); it is decrypted on the worker when a step's tool runs,
    never returned by the API nor shown in the admin.
    """

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=100)
    value_encrypted = models.BinaryField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="secret_unique_name"),
            models.CheckConstraint(
                condition=models.Q(name__regex=f"^{SECRET_NAME_PATTERN}$"),
                name="secret_name_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name
