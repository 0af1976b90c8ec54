"""Cross-checks between settings, run by every settings module after its own overrides.

Each variable is valid on its own (``config.env.Env`` checked it); these catch the
combinations that would fail later, at the worst moment: a lease that expires before it
is renewed, a broker that hands a running step to a second worker, a price the ledger
cannot store. A problem is added to ``env.errors``, so start-up refuses with a message
that names the variables.
"""

from __future__ import annotations

import getpass
import math
from decimal import Decimal, InvalidOperation
from typing import Any

from config.env import Env

# The ledger's columns: DecimalField(max_digits=18, decimal_places=6).
LEDGER_PLACES = 6
LEDGER_DIGITS = 18


def _decimal_problem(name: str, value: Any) -> str | None:
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return f"{name} must be a decimal number of credits, got {value!r}"
    if not number.is_finite() or number < 0:
        return f"{name} must be a finite, non-negative number of credits, got {value!r}"
    # By magnitude, not by digits written: "1e20" has one digit and 21 integer places.
    if number >= Decimal(10) ** (LEDGER_DIGITS - LEDGER_PLACES):
        return f"{name} is too large for the ledger, got {value!r}"
    # Trailing zeros are no precision: "1.500000000" is 1.5 and fits.
    exponent = number.normalize().as_tuple().exponent
    places = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    if places > LEDGER_PLACES:
        return (
            f"{name} has {places} decimal places, got {value!r}; the ledger keeps {LEDGER_PLACES}"
        )
    return None


def _login_name() -> str:
    """The role libpq uses when the URL names none: the user's login name ("" unknown,
    as for a container's user with no entry in /etc/passwd)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def check_consistency(env: Env, settings: dict[str, Any]) -> None:
    """Append to ``env.errors`` every inconsistent combination in a settings module's
    namespace (its ``globals()``, after its own overrides)."""
    heartbeat = float(settings["ENGINE_HEARTBEAT_SECONDS"])
    lease = float(settings["ENGINE_LEASE_SECONDS"])
    if heartbeat <= 0 or lease <= 0:
        env.errors.append(
            f"ENGINE_HEARTBEAT_SECONDS ({heartbeat:g}) and ENGINE_LEASE_SECONDS ({lease:g}) "
            "must be positive"
        )
    elif heartbeat >= lease:
        # A lease renewed no sooner than it expires is reclaimed from a live worker.
        env.errors.append(
            f"ENGINE_HEARTBEAT_SECONDS ({heartbeat:g}) must be shorter than "
            f"ENGINE_LEASE_SECONDS ({lease:g}): a running step's lease would expire before "
            "its renewal"
        )

    hold = float(settings["ENGINE_CLAIM_BATCH_HOLD_SECONDS"])
    if hold <= 0 or 2 * hold > lease:
        # A batch's step waiting for its start has the lease its claim gave it, not
        # renewed: it is handed back within one and a half holds (a heartbeat tick is at
        # most half of one), before that lease could expire under a live worker.
        env.errors.append(
            f"ENGINE_CLAIM_BATCH_HOLD_SECONDS ({hold:g}) must be positive and at most half "
            f"of ENGINE_LEASE_SECONDS ({lease:g}): a step of a batch waiting for its start "
            "would lose its lease to the sweep"
        )

    longest_step = settings["ORCHESTRATOR_PLAN_LIMITS"]["max_step_timeout_ms"] / 1000
    grace = int(settings["ENGINE_HARD_LIMIT_GRACE"])
    burst = float(settings["ENGINE_BURST_SECONDS"])
    visibility = int(settings["CELERY_VISIBILITY_TIMEOUT"])
    task_limit = int(settings["CELERY_TASK_TIME_LIMIT"])
    # The longest task is a pick-up: a task's default limit to pick the run up, then a
    # doorbell's: a burst, then the longest step it may start at the burst's end, plus
    # two graces (orchestrator.transport.pick_up_limits and doorbell_limits).
    longest_task = task_limit + math.ceil(burst + longest_step) + 2 * grace
    if visibility <= longest_task:
        # Redis would hand a message still being worked on to a second worker.
        env.errors.append(
            f"CELERY_VISIBILITY_TIMEOUT ({visibility} s) must be greater than "
            f"CELERY_TASK_TIME_LIMIT ({task_limit} s) plus PLAN_MAX_STEP_TIMEOUT "
            f"({longest_step:g} s) plus ENGINE_BURST_SECONDS ({burst:g} s) plus twice the "
            f"hard-limit grace ({grace} s): a run's pick-up, which serves its first steps, "
            "would be delivered again while still running"
        )

    runner_beat = int(settings["RUNNER_HEARTBEAT_INTERVAL"])
    runner_stale = int(settings["RUNNER_STALE_AFTER"])
    if runner_stale <= runner_beat:
        # A runner heartbeating on time would be found stale, and its jobs recovered.
        env.errors.append(
            f"RUNNER_STALE_AFTER ({runner_stale} s) must be longer than "
            f"RUNNER_HEARTBEAT_INTERVAL ({runner_beat} s): a live runner would be stale "
            "between two heartbeats"
        )

    tick = int(settings["SCHEDULES_TICK_SECONDS"])
    misfire = int(settings["SCHEDULES_MISFIRE_GRACE"])
    if misfire <= tick:
        # A due time reached by the next tick on time would count as missed (catchup: none).
        env.errors.append(
            f"SCHEDULES_MISFIRE_GRACE ({misfire} s) must be longer than "
            f"SCHEDULES_TICK_SECONDS ({tick} s): a due time reached by the next tick would "
            "be missed"
        )

    webhook_timeout = float(settings["WEBHOOK_TIMEOUT"])
    webhook_lease = float(settings["WEBHOOK_LEASE"])
    if webhook_timeout <= 0 or webhook_lease <= webhook_timeout:
        # A delivery still being sent would be claimed again and sent twice at once.
        env.errors.append(
            f"WEBHOOK_LEASE ({webhook_lease:g} s) must be longer than WEBHOOK_TIMEOUT "
            f"({webhook_timeout:g} s), which must be positive"
        )
    if float(settings["WEBHOOK_BACKOFF"]) <= 0 or float(settings["WEBHOOK_BACKOFF_MAX"]) < float(
        settings["WEBHOOK_BACKOFF"]
    ):
        env.errors.append("WEBHOOK_BACKOFF must be positive and at most WEBHOOK_BACKOFF_MAX")

    if settings["ARTIFACTS_BACKEND"] == "s3" and not settings["ARTIFACTS_S3_BUCKET"]:
        env.errors.append("ARTIFACTS_S3_BUCKET is required when ARTIFACTS_BACKEND is s3")
    if int(settings["ARTIFACT_MAX_FILE_BYTES"]) > int(settings["ARTIFACT_RUN_MAX_BYTES"]):
        env.errors.append(
            f"ARTIFACT_MAX_FILE_BYTES ({settings['ARTIFACT_MAX_FILE_BYTES']}) must not exceed "
            f"ARTIFACT_RUN_MAX_BYTES ({settings['ARTIFACT_RUN_MAX_BYTES']}): no run could hold "
            "a file that large"
        )

    role = settings["DATABASES"]["default"].get("USER") or _login_name()
    if role in settings["DATABASE_CODE"]:
        # PostgreSQL's search path ("$user", public) puts a schema named for the role
        # first: a migration's new table would be made in the database code's schema, and
        # dropped with it at the next install (common.database_code).
        env.errors.append(
            f"DATABASE_URL's role must not be named {role!r}, the name of a schema of the "
            f"database's code ({', '.join(settings['DATABASE_CODE'])}): the search path would "
            "put the tables of new migrations there, to be dropped at the next install"
        )

    prices = {
        "BILLING_LLM_PRICE_PER_1K_TOKENS": settings["BILLING_LLM_PRICE_PER_1K_TOKENS"],
        "BILLING_LLM_ESTIMATE": settings["BILLING_LLM_ESTIMATE"],
        "BILLING_MIN_RESERVATION": settings["BILLING_MIN_RESERVATION"],
        "BILLING_DEFAULT_TOOL_PRICE": settings["BILLING_DEFAULT_TOOL_PRICE"],
        "BILLING_WAIT_PRICE_PER_DAY": settings["BILLING_WAIT_PRICE_PER_DAY"],
        **{
            f"BILLING_TOOL_PRICES[{tool}]": price
            for tool, price in settings["BILLING_TOOL_PRICES"].items()
        },
    }
    # Each price becomes a ledger amount: DECIMAL(18, 6), finite, never negative.
    for name, value in prices.items():
        problem = _decimal_problem(name, value)
        if problem:
            env.errors.append(problem)
