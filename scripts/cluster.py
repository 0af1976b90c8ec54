#!/usr/bin/env python3
"""`make cluster` / `make cluster-down`: the stack as fourteen hosts in network namespaces
on this machine (root only). ``scripts/cluster.py up [--check] | down | status``; the
harness is ``reliability.cluster`` (its docstring says what runs where)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reliability.cluster import main

if __name__ == "__main__":
    sys.exit(main())
