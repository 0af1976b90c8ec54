from django.apps import AppConfig
from django.db.models.signals import post_migrate


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # The database's code (runs/engine/sql) is installed once the tables it reads
        # are migrated: after every `manage.py migrate`, when a file changed.
        from runs.engine import sql

        post_migrate.connect(sql.install_after_migrate, sender=self)
