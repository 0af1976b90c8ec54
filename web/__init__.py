"""The web tier's pages that are not the REST API: the front page (``home``), the
operators' dashboard at /admin/dashboard/ (``dashboard``), `GET /metrics` for Prometheus
(``prometheus``) and `GET /healthz` for load balancers and probes (``health``), with
their templates and the project's icon. Routed by ``config.urls``.

Like ``api`` and ``orchestrator`` (the Celery worker), an interface over the apps below:
it reads the runs, the ledger and what the processes keep in the broker's Redis, changes
nothing, and imports neither of the other two. What it shares with the worker lives
below both: the counters in ``common.metrics``, the queues' Redis lists and beat's tick
key in ``config.celery``.
"""
