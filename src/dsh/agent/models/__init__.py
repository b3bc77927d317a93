"""Model clients: the OpenAI-compatible streaming client and the scripted replay client.

Layer: agent. Both satisfy `dsh.agent.model.ModelClient`. `OpenAICompatibleClient` talks to any
OpenAI-compatible endpoint (DeepSeek by default) with settings from `resolve_model_settings`;
`ScriptedModelClient` replays a JSON script for keyless runs, the demo and tests
(docs/agent.md#model-clients). The names are loaded on first access (PEP 562), so importing this
package pulls in neither pydantic nor the `openai` SDK; the SDK itself is imported only when the first
OpenAI-compatible client is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from dsh.agent.models.openai_compat import (
        DEEPSEEK_HOST,
        OpenAICompatibleClient,
        ResolvedModelSettings,
        resolve_model_settings,
    )
    from dsh.agent.models.scripted import ModelScript, ScriptedModelClient

__all__ = [
    "DEEPSEEK_HOST",
    "ModelScript",
    "OpenAICompatibleClient",
    "ResolvedModelSettings",
    "ScriptedModelClient",
    "resolve_model_settings",
]

_HOMES: Final[dict[str, str]] = {
    "DEEPSEEK_HOST": "dsh.agent.models.openai_compat",
    "OpenAICompatibleClient": "dsh.agent.models.openai_compat",
    "ResolvedModelSettings": "dsh.agent.models.openai_compat",
    "resolve_model_settings": "dsh.agent.models.openai_compat",
    "ModelScript": "dsh.agent.models.scripted",
    "ScriptedModelClient": "dsh.agent.models.scripted",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
