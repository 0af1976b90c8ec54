"""Operators' view of runs: find them, see the hierarchy and the history, steer them.

Everything here is read-only; the actions call the same services as the API. Pages
run a bounded number of queries whatever the size of the table (`list_select_related`,
aggregated hierarchy, a capped event list).

Django's admin autodiscovery imports this package; each module registers its models
when imported: ``runs`` (runs and their events; the run's page is ``run_page``, its
controls ``controls``), ``waits`` (runners, their jobs, callback and poll waits),
``escalations`` (tickets and re-plans), ``organizations`` (limits and load on billing's
organization page) and ``rate_limits``.
"""

from runs.admin import escalations, organizations, rate_limits, runs, waits  # noqa: F401
