from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Orchestrator engine"

    def ready(self) -> None:
        # Built-in tools register themselves; plans are validated against the registry.
        from orchestrator.tools import builtin  # noqa: F401
