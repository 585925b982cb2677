"""What the benchmark scripts share that is not a benchmark: loading a
sibling benchmark's module by path (bench/ is scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


def load(name: str, path: str) -> Any:
    """The module at ``path`` as ``name`` (loaded once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
