"""The `/api/v1` routes: sessions (`sessions`), subagents (`subagents`) and the push stream (`stream`).

Layer: server. Shared dependencies, responses and OpenAPI error documentation live in `deps`.
"""
