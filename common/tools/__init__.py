"""The tool interface (`base`) and the registry of tool names (`registry`); the
implementations live on the Celery side, in `orchestrator.tools`."""
