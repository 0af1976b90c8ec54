"""`make bench`: the engine against raw Celery, same broker, same worker processes.

Not part of `make test`: figures are measured and reported, never asserted. See
``bench.run`` for what is measured and how.
"""
