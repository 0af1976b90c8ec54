"""What people decide about runs: the approval decisions a run waits on (``approvals``),
tickets that hand a failing run to on-call (``escalations``), re-plans that replace
failing agents with what a planner proposes (``replanning``, asking ``planners``), and an
organization suspended by an operator (``suspension``). Their rows are in
``runs/models/people.py``; docs/escalation.md and docs/tenants.md describe them."""
