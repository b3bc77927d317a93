"""Benchmarks: variants compared in the same run, reported as ratios (never asserted in tests)."""
