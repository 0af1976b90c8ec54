from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Orchestrator engine"
