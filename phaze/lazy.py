"""A heavy third-party library imported on its first use, so that the commands that never use
it (``phaze evaluate``, ``phaze place``) do not pay for importing it."""
from __future__ import annotations

import importlib


class LazyModule:
    """Stands for the module ``name``; the first attribute read imports it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


# the deferred libraries (one instance each, shared by the modules that use them)
pd = LazyModule("pandas")   # 0.15 s to import, and evaluate and place never need it
tqdm = LazyModule("tqdm")   # 19 ms to import (it reads its package metadata); evaluate and place show no bar
