"""Subagents: the descriptor, the identity and timing units, the child catalog and the runtime operations.

Layer: subagent (above query, projection and agent). `SubagentRuntime` (`runtime.py`) is the service
(`Services.subagents`). Public modules: `descriptor` (the `subagent/descriptor` payload), `units`
(the projection units), `listing` and `rows` (the catalog, which needs no agent runtime),
`providers` (the provider seam and request/result shapes), `authority` (who may interrupt),
`activation` (a resident continuable child), `host` (what the composition root provides), `depth`
and `errors`. Private: `_inprocess` (the `spawn` and `fork` providers and the one-shot driver),
`_continuation` (continuable starts, follow-ups, cold resume, interrupts, settlement, drain),
`_compose` and `_sync`. See docs/subagents.md and docs/catalog.md.
"""
