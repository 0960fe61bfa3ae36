"""The official SDKs, imported when a test first uses them (`sdks.openai`, `sdks.anthropic`): importing
both costs ~2 CPU-seconds, and every pytest-xdist worker collects every module, most never running these
tests. (Not importlib's LazyLoader: a lazy module in sys.modules is loaded by the first tool that scans
them, as pytest's collection and Hypothesis do.)"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["anthropic", "openai"]

if TYPE_CHECKING:
    import anthropic
    import openai
else:

    def __getattr__(name: str) -> ModuleType:
        if name in __all__:
            return importlib.import_module(name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
