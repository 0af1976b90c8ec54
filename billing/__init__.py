"""Organizations and what they pay with: API keys and their scopes, secrets, credits and
the append-only ledger that reserves, charges and settles them exactly once, prices,
and quotas (docs/engine.md, "Billing: exactly once"; docs/tenants.md). The floor every
app above stands on."""
