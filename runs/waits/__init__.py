"""What a step waits on outside the Celery worker: runners and ``orch worker``s polling for
its jobs (``runners``), a callback posted or a poll's condition (``callbacks``), and a
child run (``children``). The engine parks the step (``runs.engine.waiting``); these
services end its wait. Their rows are in ``runs/models/waits.py``; docs/runners.md."""
