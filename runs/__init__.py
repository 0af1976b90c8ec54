"""Runs: the hierarchy (run, attempt, agent, task, step), its state machines and the one
door of its transitions, the plan, and every operation on a run, in rooms:

- ``plan/``: a plan parsed and checked, its fields, graph and durations;
- ``engine/``: what happens to a running attempt: its start, dispatch, a step's
  recording, failure policy and propagation, waits, in PostgreSQL functions (``sql/``,
  the schema ``runs``) and the Python that calls them;
- ``waits/``: what a step waits on outside the worker: runners, callbacks, child runs;
- ``people/``: approvals, escalations, re-plans, an organization suspended;
- ``admission/``: when a run may start and a step's tool run, fair dispatch;
- ``admin/``: the operators' pages, the run page among them;
- ``models/``: the rows, one module per room; ``queries/``: the named reads; ``sql/``:
  the database's functions, views and triggers (``common.database_code`` installs them).

At the top, the services every room shares: ``services`` (a run's lifecycle),
``transitions``, ``selectors`` and ``filters``, ``materialize``, ``reservation``,
``reuse``, ``forks``, ``catalogue``, ``outbox``, ``invariants``. The rooms import in
layers (the import contracts in pyproject.toml; docs/architecture.md draws them)."""
