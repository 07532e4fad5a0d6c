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
