"""The run engine (docs/configuration.md, "Engine" and "Timeouts"): child runs,
callbacks and polls, step leases, sweeps, doorbells and batches, the runner protocol,
every timed state's default, and the fair sharing of the fleet between organizations."""

from __future__ import annotations

from config.settings.broker import CELERY_TASK_TIME_LIMIT, CELERY_VISIBILITY_TIMEOUT
from config.settings.environment import env

# --------------------------------------------------------------------------- waits
# Child runs, callbacks and polls (docs/runners.md, "Child runs" and "Asynchronous
# steps"). A run started by a `run` step is one level deeper than its parent (the top run
# is at depth 0); one that would be deeper than RUN_MAX_DEPTH fails its step with
# run_depth_exceeded. A callback URL is PUBLIC_BASE_URL/api/v1/callbacks/<token>. A
# child's end or a poll message lost with the broker is acted on by the wait sweep once
# WAIT_LOST_AFTER has passed.
RUN_MAX_DEPTH = env.integer(
    "RUN_MAX_DEPTH", 5, "deepest a child run may nest (the top run is 0)", minimum=0, maximum=20
)
# By default the web `make run` and the Procfile start, on WEB_PORT: a web moved to another
# port is still the one callback URLs and webhook links name.
WEB_PORT = env.integer(
    "WEB_PORT", 8000, "the web's port (Procfile, make run)", minimum=1, maximum=65535
)
PUBLIC_BASE_URL = env.string(
    "PUBLIC_BASE_URL",
    f"http://127.0.0.1:{WEB_PORT}",
    "the API's address as others reach it, for callback URLs and webhook links",
).rstrip("/")
WAIT_LOST_AFTER = env.integer(
    "WAIT_LOST_AFTER", 30, "seconds before the sweep re-sends a lost poll or child end", minimum=1
)
CALLBACK_MAX_TIMEOUT = 30 * 24 * 3600
POLL_MIN_INTERVAL = 0.05

# --------------------------------------------------------------------------- engine
# Step leases: a running step's lease is renewed every ENGINE_HEARTBEAT_SECONDS; a sweep
# reclaims steps whose lease expired (ENGINE_LEASE_SECONDS without renewal), at most
# ENGINE_MAX_RECLAIMS times, then fails them with `worker_lost`.
ENGINE_HEARTBEAT_SECONDS = env.number(
    "ENGINE_HEARTBEAT_SECONDS", 20, "how often a running step renews its lease"
)
ENGINE_LEASE_SECONDS = env.number(
    "ENGINE_LEASE_SECONDS", 60, "a step lease not renewed for this long is reclaimed"
)
# Seconds between a step's soft time limit (the tool is interrupted, the attempt fails
# with `timeout`) and the hard one (the process is killed).
ENGINE_HARD_LIMIT_GRACE = 10
ENGINE_MAX_RECLAIMS = env.integer(
    "ENGINE_MAX_RECLAIMS", 3, "reclaims before worker_lost", minimum=0
)
ENGINE_DEFAULT_STEP_TIMEOUT = env.number(
    "ENGINE_DEFAULT_STEP_TIMEOUT", 30, "seconds a step may run when its plan sets no timeout"
)
# Rate limits (docs/rate-limits.md): a step that waited for its units and is claimed
# this long after its reserved moment (every slot was busy, its run was paused) asks
# again: units used long after their grant could bunch up calls beyond the limit.
RATE_LIMIT_LATE_S = env.number(
    "RATE_LIMIT_LATE_S", 2, "seconds a rate-limited step may start after its reserved moment"
)
# A step that arrives ahead of steps already waiting re-plans at most this many of them,
# the back of the line: the cost of one step's ask stays bounded however long the line.
RATE_LIMIT_REPLAN_MAX = env.integer(
    "RATE_LIMIT_REPLAN_MAX", 200, "most waiting steps one ask re-plans", minimum=1
)
# The step-message horizon: no step message waits in the broker longer than this. A step
# due later (a timer of days, a rate limit's reservation, a long backoff) has no message
# at all: it is `asleep`, and the wake sweep sends its message, with the exact countdown,
# once its time comes within this horizon (runs.engine.dispatch.wake_asleep). Never one
# countdown that Redis would deliver again every visibility timeout while a worker holds it.
RATE_LIMIT_MAX_COUNTDOWN_S = env.integer(
    "RATE_LIMIT_MAX_COUNTDOWN_S",
    300,
    "longest countdown (s) of a step message; a step due later is woken by the wake sweep",
    minimum=1,
)
# A worker holds a step message unacknowledged through its countdown and then its run.
if RATE_LIMIT_MAX_COUNTDOWN_S + CELERY_TASK_TIME_LIMIT >= CELERY_VISIBILITY_TIMEOUT:
    env.errors.append(
        "RATE_LIMIT_MAX_COUNTDOWN_S + CELERY_TASK_TIME_LIMIT must be less than "
        "CELERY_VISIBILITY_TIMEOUT"
    )
# Beat looks for the work of the lease, timeout, runner and wait sweeps this often, and
# sends each when its work is due (orchestrator/periodic.py).
ENGINE_SWEEP_INTERVAL = env.integer(
    "ENGINE_SWEEP_INTERVAL", 15, "seconds between beat's looks for the sweeps' work", minimum=1
)
ENGINE_SWEEP_BATCH = env.integer(
    "ENGINE_SWEEP_BATCH", 500, "rows a sweep handles per run", minimum=1
)
# Doorbells (orchestrator.transport): the steps of a run that are ready to start are rows
# that a worker claims one after another (runs.transitions.claim_next_step); the broker
# carries doorbells, at most ENGINE_DOORBELLS per run per transaction, not one message
# per step. A doorbell serves its run for at most ENGINE_BURST_STEPS steps or
# ENGINE_BURST_SECONDS, then rings again at the back of the queue, so that other runs'
# work gets its turn. ENGINE_DOORBELLS=0 sends one message per step instead.
ENGINE_DOORBELLS = env.integer(
    "ENGINE_DOORBELLS",
    8,
    "doorbells sent per run for its ready steps (0: one message per step)",
    minimum=0,
)
ENGINE_BURST_STEPS = env.integer(
    "ENGINE_BURST_STEPS", 200, "steps a doorbell serves before ringing again", minimum=1
)
ENGINE_BURST_SECONDS = env.number(
    "ENGINE_BURST_SECONDS", 1.0, "seconds a doorbell serves its run before ringing again"
)
# Batches (docs/engine.md, "Batches"): a server whose last step was short claims up to
# ENGINE_CLAIM_BATCH of its run's next steps with the recording, and runs them in turn;
# those still waiting ENGINE_CLAIM_BATCH_HOLD_SECONDS after the claim are handed back.
ENGINE_CLAIM_BATCH = env.integer(
    "ENGINE_CLAIM_BATCH", 8, "steps a server may claim at once (1: one at a time)", minimum=1
)
ENGINE_CLAIM_BATCH_HOLD_SECONDS = env.number(
    "ENGINE_CLAIM_BATCH_HOLD_SECONDS",
    1.0,
    "seconds a batch's steps may wait for their start before they are handed back",
)
# A run admitted at its start whose plan has at most this many steps begins in the
# start's own transaction (RUNNING, its first steps claimable at commit) instead of
# waiting for a worker's pick-up; a bigger plan is materialised by a worker, so that a
# web process and the organization's admission lock are not held for long. 0: every run
# is picked up by a worker.
ENGINE_START_AT_ONCE_STEPS = env.integer(
    "ENGINE_START_AT_ONCE_STEPS",
    200,
    "steps a plan may have to begin in its start's own transaction",
    minimum=0,
)
# Runs with a priority at or below this number go to runs.high_priority.
ENGINE_HIGH_PRIORITY_MAX = env.integer(
    "ENGINE_HIGH_PRIORITY_MAX", 2, "priorities 0..N use runs.high_priority", minimum=0, maximum=9
)

# Publishing engine messages can be switched off (tests that exercise services without a
# worker); the database then holds the work and the lost-message sweep would send it.
ORCHESTRATOR_DISPATCH_ENABLED = True

# --------------------------------------------------------------------------- runners
# The runner protocol (docs/runners.md). A runner long-polls for jobs, holding a poll for
# up to RUNNER_POLL_TIMEOUT seconds, and heartbeats every RUNNER_HEARTBEAT_INTERVAL; one
# silent for RUNNER_STALE_AFTER is stale: its jobs are recovered (runner_lost) and its
# identity may register again. A job no runner claims within its match timeout fails
# its step with no_matching_runner.
RUNNER_POLL_TIMEOUT = env.integer(
    "RUNNER_POLL_TIMEOUT", 30, "longest a runner's poll is held, seconds", minimum=0, maximum=30
)
RUNNER_HEARTBEAT_INTERVAL = env.integer(
    "RUNNER_HEARTBEAT_INTERVAL", 60, "seconds between a runner's heartbeats", minimum=1
)
RUNNER_STALE_AFTER = env.integer(
    "RUNNER_STALE_AFTER", 120, "seconds without a heartbeat before a runner is stale", minimum=1
)
RUNNER_MATCH_TIMEOUT = env.integer(
    "RUNNER_MATCH_TIMEOUT", 300, "seconds a runner job may wait for a runner", minimum=1
)

# --------------------------------------------------------------------------- timeouts
# Defaults for every timed state and level, in seconds; a plan's `timeouts` override them
# per run.
RUN_TIMEOUT_DEFAULTS = {
    "run": env.integer("TIMEOUT_RUN", 24 * 3600, "seconds a run may be RUNNING", minimum=1),
    "agent": env.integer("TIMEOUT_AGENT", 6 * 3600, "seconds an agent may run", minimum=1),
    "task": env.integer("TIMEOUT_TASK", 3600, "seconds a task may run", minimum=1),
    "step": int(ENGINE_DEFAULT_STEP_TIMEOUT),
    "pending": env.integer(
        "TIMEOUT_PENDING", 24 * 3600, "seconds a run may wait PENDING", minimum=1
    ),
    "paused": env.integer(
        "TIMEOUT_PAUSED", 7 * 24 * 3600, "seconds a run may stay PAUSED", minimum=1
    ),
    "resuming": env.integer("TIMEOUT_RESUMING", 300, "seconds a run may stay RESUMING", minimum=1),
    "retrying": env.integer(
        "TIMEOUT_RETRYING", 24 * 3600, "seconds a run may stay RETRYING", minimum=1
    ),
    # An escalated run waits this long for a person, then fails with escalation_timeout.
    "escalated": env.integer(
        "TIMEOUT_ESCALATED", 24 * 3600, "seconds a run may stay ESCALATED", minimum=1
    ),
    # A run never started costs nothing and counts against no limit: it is cancelled
    # after this long (created_timeout), and its artifacts then expire like any ended
    # run's. The server's bound, not the client's: no plan's `timeouts` changes it.
    "created": env.integer(
        "CREATED_RUN_TTL", 7 * 24 * 3600, "seconds a run may stay CREATED", minimum=1
    ),
}
# A step dispatched, pending and due for this long without being claimed lost its message.
ENGINE_LOST_MESSAGE_AFTER = env.integer(
    "ENGINE_LOST_MESSAGE_AFTER", 120, "seconds before an unclaimed due step is re-sent", minimum=1
)

# --------------------------------------------------------------------------- fairness
# Sharing one fleet between organizations (docs/fairness.md). Each limit is a default an
# organization's own (set in the admin) overrides. Runs beyond the running limit wait
# PENDING (never refused); beyond the pending limit a start is refused (429).
ORG_MAX_RUNNING_RUNS = env.integer(
    "ORG_MAX_RUNNING_RUNS", 1000, "runs an organization may have running at once", minimum=1
)
ORG_MAX_RUNNING_STEPS = env.integer(
    "ORG_MAX_RUNNING_STEPS", 1000, "steps an organization may have executing at once",
    minimum=1,
)  # fmt: skip
ORG_MAX_PENDING_RUNS = env.integer(
    "ORG_MAX_PENDING_RUNS", 10_000, "runs an organization may have waiting to start", minimum=1
)
# Fair dispatch: a worker serving steps looks every ENGINE_FAIR_SLICE seconds for the
# organization with the fewest steps executing (then the longest unserved). Off serves
# each doorbell's own run, as before fair dispatch: for measuring it only.
ENGINE_FAIR_DISPATCH = env.boolean(
    "ENGINE_FAIR_DISPATCH", True, "share the workers fairly between organizations"
)
ENGINE_FAIR_SLICE = env.number(
    "ENGINE_FAIR_SLICE", 0.02, "seconds a worker serves a run before it looks again"
)
