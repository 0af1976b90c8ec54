"""The execution engine's decisions: how a run's plan becomes step messages, and how
each finished step moves the run forward.

One scheme covers every level (agents of a run, tasks of an agent, steps of a task):
each child has a count of dependencies it still waits for and the names of the siblings
that wait for it. A sequential parent is a chain (each child waits for the one before),
a parallel parent has no edges, a dag has its own. When a child finishes, the same
transaction decrements its dependents' counts and dispatches the children that became
ready, as long as the parent's concurrency limit allows; when a parent's last child
finishes, the parent finishes and the same happens one level up. Step messages go to
the outbox (``runs.outbox``) and are published after commit, one message per step
attempt, carrying only the step id: a 1,000-step chain costs what 1,000 one-link chains
cost, and a 2,000-wide fan-out joins on a counter instead of chord_unlock polling.

Every function here runs inside a transaction that holds the run's row lock (taken
first, so the lock order run -> agent -> task -> step holds everywhere). Only one engine
transaction per run is in flight at a time, which is what keeps the counters exact.

The modules, each importing only those after it (an import contract checks it):

- ``control``: pick a run up, resume it after a pause;
- ``outcomes``: record a step attempt's outcome (charge, complete, retry or fail);
- ``hotpath``: the plainest outcome (a step completed, its task goes on) in one statement;
- ``handlers``: a failed step's on_error handlers;
- ``failure``: failure modes (continue, retry the level, fail fast) and level restarts;
- ``propagation``: a finished child counted, its dependents released, its parent finished
  (``runs.child_done``: the rule is the database's, as the hot path's is);
- ``dispatch``: the children that are ready, within the concurrency limits (the
  database's ``runs.*_dispatch``);
- ``tree``: the levels treated alike; ``retry``: a step's retry policy and backoff.

Nothing here imports Celery or the orchestrator app: it runs in any process with a
database, which is how ``tests/runs/engine`` drives it without a worker.
"""
