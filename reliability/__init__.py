"""Reliability tools: the chaos harness (`make chaos`) and the load test (`make load`)."""
