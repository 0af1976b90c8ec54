"""The Celery worker: its tasks, the executor that runs a step's tool, the transport that
carries the engine's messages, the sweeps and beat, the lease keeper, the step context,
the fleet's tools (``tools/``), and the outbound calls a worker makes (webhooks,
notifications, polls) behind the network guard (docs/architecture.md, "Processes")."""
