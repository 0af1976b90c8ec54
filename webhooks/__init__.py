"""Run webhooks: endpoints, the deliveries PostgreSQL triggers write with each state
change, and their attempts (docs/webhooks.md). The worker sends them
(``orchestrator.webhooks``)."""
