"""Settings, one module per section of docs/configuration.md, read once from the
environment (``config.env``): ``base`` gathers them; ``local``, ``test`` and
``production`` are the entry points by environment."""
