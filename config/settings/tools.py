"""The built-in tools (docs/configuration.md, "Tools"): the http tool's bounds and the
networks it may reach, the python tool's allowlist, the published tools the workers load,
and the LLM API."""

from __future__ import annotations

import ipaddress

from config.settings.environment import env

# --------------------------------------------------------------------------- tools
HTTP_TOOL_MAX_RESPONSE_BYTES = env.integer(
    "HTTP_TOOL_MAX_RESPONSE_BYTES", 1_000_000, "largest response body the http tool keeps"
)
# The http tool refuses loopback, private, link-local, multicast and reserved addresses
# (orchestrator/netguard.py); these networks are let through. Empty everywhere by default.
HTTP_TOOL_ALLOWED_NETWORKS = env.strings(
    "HTTP_TOOL_ALLOWED_NETWORKS",
    [],
    "comma-separated CIDRs the http tool may reach although private (e.g. 10.1.2.0/24)",
)
for _cidr in HTTP_TOOL_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_cidr, strict=False)
    except ValueError:
        env.errors.append(f"HTTP_TOOL_ALLOWED_NETWORKS: {_cidr!r} is not a network (CIDR)")
PYTHON_TOOL_ALLOWLIST = env.strings(
    "PYTHON_TOOL_ALLOWLIST",
    ["orchestrator.tools.examples.add", "orchestrator.tools.examples.word_count"],
    "dotted paths the python tool may call",
)
# Published tools on the fleet (docs/tools.md): the packages whose tools the workers load
# at start, by entry-point or distribution name under the group `orchestrator.tools`;
# `*` for every one installed, empty for none.
ORCHESTRATOR_TOOL_PACKAGES = env.strings(
    "ORCHESTRATOR_TOOL_PACKAGES",
    ["*"],
    "packages whose @tool functions the workers load (entry points orchestrator.tools; * all)",
)
LLM_BASE_URL = env.string("LLM_BASE_URL", "", "OpenAI-compatible API base URL (…/v1)")
LLM_API_KEY = env.string("LLM_API_KEY", "", "bearer key for the LLM API")
LLM_MODEL = env.string("LLM_MODEL", "gpt-4o-mini", "default model of the llm tool")
LLM_TIMEOUT = env.number("LLM_TIMEOUT", 60, "seconds an LLM call may take")
