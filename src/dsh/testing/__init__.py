"""Test support that ships with the library: fakes, fixtures and conformance suites.

Importable by users who build their own backends or agents: `ManualTimer` drives write-behind
windows and throttles without a wall clock; the persistence conformance suite, the fixture writer
and `FaultyBackend` check any storage backend.
"""

from dsh.testing.timer import ManualTimer

__all__ = ["ManualTimer"]
