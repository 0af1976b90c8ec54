"""The fleet's tools: the built-in ones, the packages of decorated tools the worker loads
and publishes, and the runner of an ``async`` tool (docs/tools.md)."""
