from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # A run admitted at its start begins in the start's own transaction, with the
        # engine's pick-up work (runs.services.run_start): registered here, since the
        # services sit below the engine and import nothing of it.
        from runs import services
        from runs.engine import control

        services.use_beginning(control.begin)
