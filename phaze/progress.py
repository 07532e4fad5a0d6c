"""A minimal progress bar on stderr (no dependency): redrawn in place on a terminal, one line
per step otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label, self.done = max(1, total), label, 0
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, note: str = "") -> None:
        self.done += 1
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        line = (f"{self.label} [{bar}] {self.done}/{self.total} "
                f"{time.monotonic() - self.start:5.1f}s {note}")
        if self.tty:
            self.stream.write("\r" + line.ljust(100)[:100])
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line.rstrip() + "\n")
        self.stream.flush()
