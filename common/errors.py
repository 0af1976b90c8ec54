"""The catalogue of step error codes, and which of them are worth retrying.

Transient network and service errors, rate limits and resource exhaustion are
retryable; bad input, auth, missing things and business refusals are not. A step's
`retry.retry_on` may narrow the retryable set.

The lists are written once, in the Python client (``orchestrator_client.tools.failures``),
which a tool raises them with and which imports nothing of the server; the engine reads
them from there.
"""

from __future__ import annotations

from orchestrator_client.tools.failures import (
    ERROR_CODES,
    NON_RETRYABLE_CODES,
    RETRYABLE_CODES,
    is_retryable,
)

__all__ = ["ERROR_CODES", "NON_RETRYABLE_CODES", "RETRYABLE_CODES", "is_retryable"]
