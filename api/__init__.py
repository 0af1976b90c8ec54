"""The REST API under /api/v1/: thin views over the run services and selectors.

Authentication by API key (``authentication``), errors as ``{code, message, details}``
(``errors``), ``Idempotency-Key`` on every POST (``idempotency``), throttling per key
(``throttling``), bounded bodies (``parsers``) and pages (``pagination``). docs/api.md
describes it for clients.
"""
