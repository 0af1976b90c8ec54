"""Rate limits and their grants: the sliding window that says when a limited tool may run
again (docs/rate-limits.md). Admission, which waits on it, is ``runs.admission``."""
