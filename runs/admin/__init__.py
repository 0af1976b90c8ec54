"""Operators' view of runs: find them, see the hierarchy and the history, steer them.

Everything here is read-only; the actions call the same services as the API. Pages
run a bounded number of queries whatever the size of the table (`list_select_related`,
aggregated hierarchy, a capped event list). Autodiscovery imports this package; the
modules register their models: ``runs`` (its page: ``run_page``), ``waits``, ``people``
and ``organizations`` (limits, suspension, rate limits).
"""

from runs.admin import organizations, people, runs, waits  # noqa: F401
