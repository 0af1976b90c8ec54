"""The shared leaf: what every app builds on and nothing of theirs.

Error codes, `${...}` templates and `when` expressions, secret redaction, the tool
interface and registry, the invariant registry and admin pieces. It imports no app of
this project (the import contract in `make test` holds it so).
"""
