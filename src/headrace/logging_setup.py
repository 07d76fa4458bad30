"""Structured, quiet-by-default logs: one ``key=value``-style line per notable event."""

from __future__ import annotations

import logging
import sys


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d level=%(levelname)s logger=%(name)s %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
    )
    root = logging.getLogger("headrace")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
