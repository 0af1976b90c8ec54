"""Create (or reset the password of) a superuser: `make run` prints what it set."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction


class Command(BaseCommand):
    help = "Create or update a superuser with the given password."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True)
        parser.add_argument(
            "--password",
            required=True,
            help="as --password=VALUE when it may begin with '-' (else read as an option)",
        )
        parser.add_argument("--email", default="")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        username: str = options["username"].strip()
        password: str = options["password"]
        if not username or len(password) < 8:
            raise CommandError("username must be non-empty and password at least 8 characters")
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"email": options["email"]}
        )
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"admin user {username!r} {'created' if created else 'updated'}")
