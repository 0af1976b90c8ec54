"""The parts of the run plan; ``runs.spec`` is its public entry point.

- ``model``: the plan as pydantic models. They validate a submitted plan's shape, they are
  the typed plan the engine reads, and the OpenAPI ``Plan`` schema is generated from them.
- ``fields``: the field types those models are declared with: each states its constraint
  once, for validation and for the schema, and says in the plan's words what it refuses.
- ``checks``: what the whole plan must satisfy beyond each field's shape: known tools,
  unique names, dependencies and cycles, templates, conditions, the steps' total.
- ``graph``: dependency cycles, and what is guaranteed to have finished before a child.
- ``guard``: the limits, and what is refused before the plan is read (depth, size, text
  PostgreSQL cannot store, NaN).
- ``durations``: ``"30s"`` and friends, in milliseconds.
- ``errors``: a problem with its path, and the phrases messages are built from.
"""
