"""Keyless demonstrations that run on the embedded default (no API key, no network)."""
