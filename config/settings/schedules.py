"""Run schedules (docs/configuration.md, "Schedules"; docs/schedules.md)."""

from __future__ import annotations

from config.settings.environment import env

# --------------------------------------------------------------------------- schedules
# Run schedules (docs/schedules.md): beat looks for the earliest due time every
# SCHEDULES_TICK_SECONDS (orchestrator/periodic.py) and publishes a tick when it comes,
# which fires the schedules that are due. A due time the tick reaches more than
# SCHEDULES_MISFIRE_GRACE seconds late counts as missed (beat was down), and is run or
# not by the schedule's `catchup` policy; `catchup: all` runs at most
# SCHEDULES_CATCHUP_MAX of the missed times, the latest ones.
SCHEDULES_TICK_SECONDS = env.integer(
    "SCHEDULES_TICK_SECONDS", 1, "seconds between beat's looks for a due schedule", minimum=1
)
SCHEDULES_MISFIRE_GRACE = env.integer(
    "SCHEDULES_MISFIRE_GRACE", 60, "seconds late a due time may fire before it is missed",
    minimum=1,
)  # fmt: skip
SCHEDULES_CATCHUP_MAX = env.integer(
    "SCHEDULES_CATCHUP_MAX", 100, "most missed due times `catchup: all` runs at once", minimum=1
)
# One tick handles at most SCHEDULES_TICK_MAX due schedules, organizations in turn; the
# rest are the next tick's (beat looks again every SCHEDULES_TICK_SECONDS).
SCHEDULES_TICK_MAX = env.integer(
    "SCHEDULES_TICK_MAX", 200, "most due schedules one tick handles", minimum=1
)
SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS = env.integer(
    "SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS",
    10,
    "due times refused for credits in a row after which a schedule pauses itself",
    minimum=1,
)
