"""What a client may filter the ledger by: the FilterSet ``billing.selectors`` applies."""

from __future__ import annotations

from typing import ClassVar

import django_filters

from billing.models import EntryType, LedgerEntry
from common.filters import StrictFilterSet


class LedgerFilter(StrictFilterSet):
    type = django_filters.ChoiceFilter(choices=EntryType.choices)
    run = django_filters.UUIDFilter(field_name="run_id", help_text="Only this run's entries.")

    class Meta:
        model = LedgerEntry
        fields: ClassVar[list[str]] = []
