"""Operators' view of runs: find them, see the hierarchy and the history, steer them.

Everything here is read-only; the actions call the same services as the API. Pages
run a bounded number of queries whatever the size of the table (`list_select_related`,
aggregated hierarchy, a capped event list). Autodiscovery imports this package; the
modules register their models: ``runs`` (its page: ``run_page``) and ``waits``.
"""

from runs.admin import runs, waits  # noqa: F401
