from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Orchestrator engine"

    def ready(self) -> None:
        from common import logcontext
        from orchestrator.tools import asynchronous, builtin, packages  # noqa: F401
        from orchestrator.transport import CeleryTransport
        from runs.outbox import use_transport

        # Built-in tools register themselves; plans are validated against the registry.
        # The fleet's published tools come from the installed packages (docs/tools.md).
        packages.load()
        # Run messages leave through Celery (the run lifecycle never imports it).
        use_transport(CeleryTransport())
        # Log records carry the run, step, attempt and organization being worked on.
        logcontext.install()
