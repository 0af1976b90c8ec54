"""The orchestrator keeps no rows of its own: the run hierarchy is runs', the money
billing's, the stored `Idempotency-Key` responses the API's (``api.models``)."""
