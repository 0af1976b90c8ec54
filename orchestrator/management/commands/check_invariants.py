"""Verify every registered invariant over the whole database; exit 1 on any violation."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from common.invariants import all_invariants


class Command(BaseCommand):
    help = "Check the system invariants (hierarchy, states, billing...) and list violations."

    def handle(self, *args: Any, **options: Any) -> None:
        failed = 0
        checks = all_invariants()
        for item in checks:
            violations = item.check()
            if violations:
                failed += 1
                self.stdout.write(f"FAIL {item.name}: {item.description}")
                for violation in violations:
                    self.stdout.write(f"  - {violation}")
            else:
                self.stdout.write(f"ok   {item.name}")
        if failed:
            raise CommandError(f"{failed} of {len(checks)} invariants violated")
        self.stdout.write(f"all {len(checks)} invariants hold")
