"""What an organization may use at once: when a run may start (``run_admission``), which
run a free worker serves next and the step slots that cap an organization's running
steps (``fairness``), and when a step's tool may run under its rate limits
(``step_admission``). Their rows are in ``runs/models/admission.py``; docs/fairness.md
and docs/rate-limits.md describe them."""
