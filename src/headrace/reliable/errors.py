"""Errors of the reliable-processing library, named by whose fault they are."""

from __future__ import annotations


class ReliableUsageError(Exception):
    """Our caller broke a rule (ack twice, emit anchored to a finished item, ack an offset
    that was never emitted). The object that raised it is unchanged."""


class ReliableConfigError(ValueError):
    """A configuration value is out of range or two values contradict each other."""
