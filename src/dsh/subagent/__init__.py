"""Subagents: the descriptor, the identity and timing units, and the child catalog.

Layer: subagent (above query and projection). The listing part (`listing.py`, `rows.py`) needs no
agent runtime; `SubagentRuntime` is the service (`Services.subagents`).
"""
