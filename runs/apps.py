from django.apps import AppConfig
from django.db.models.signals import post_migrate


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # The database's code (every app's sql/ folder, settings.DATABASE_CODE) is
        # installed once the tables it reads are migrated: after every `manage.py
        # migrate`, when a file changed. Connected once, here, the app most of it is for.
        from common import database_code

        post_migrate.connect(database_code.install_after_migrate, sender=self)
