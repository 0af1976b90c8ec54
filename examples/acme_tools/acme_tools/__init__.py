"""Example tools (docs/tools.md): ``fleet`` runs on the Celery workers, ``worker`` on an
``orch worker`` of your own."""
