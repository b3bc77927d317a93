"""Model settings: where each field comes from, which key may go to which host, and that the key stays secret.

Layer: agent (tests). Settings are resolved from `dsh.Config().model` (read from the environment)
plus caller overrides, the way the CLI resolves them; nothing here opens a connection.
"""

from __future__ import annotations

import logging
import os

import pytest
from pydantic import SecretStr

from dsh.agent.errors import ModelError
from dsh.agent.models import OpenAICompatibleClient, ResolvedModelSettings, resolve_model_settings
from dsh.config import Config, ModelConfig

DEEPSEEK_KEY = "sk-deepseek-secret-1111"
DSH_KEY = "sk-dsh-secret-2222"
FLAG_KEY = "sk-flag-secret-3333"
SECRETS = (DEEPSEEK_KEY, DSH_KEY, FLAG_KEY)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without DSH_* or DEEPSEEK_API_KEY, so the developer's shell cannot leak in."""
    for name in list(os.environ):
        if name.startswith("DSH_") or name == "DEEPSEEK_API_KEY":
            monkeypatch.delenv(name)


def _resolved(**overrides: object) -> ResolvedModelSettings:
    return resolve_model_settings(Config().model, **overrides)  # type: ignore[arg-type]


def _not_configured(**overrides: object) -> ModelError:
    with pytest.raises(ModelError) as caught:
        _resolved(**overrides)
    assert caught.value.code == "MODEL_NOT_CONFIGURED"
    return caught.value


def test_deepseek_key_alone_gives_the_deepseek_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """With only DEEPSEEK_API_KEY set, every other field has its default and the provider is `deepseek`."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", DEEPSEEK_KEY)
    settings = _resolved()
    assert settings.base_url == "https://api.deepseek.com"
    assert settings.api_key.get_secret_value() == DEEPSEEK_KEY
    assert settings.key_source == "deepseek_api_key"
    assert (settings.model, settings.provider) == ("deepseek-chat", "deepseek")
    assert (settings.timeout_s, settings.max_retries, settings.max_tokens) == (120.0, 2, None)


def test_no_key_is_not_configured_with_a_hint() -> None:
    """Without any key, resolution fails with MODEL_NOT_CONFIGURED naming both variables and `dsh demo`."""
    error = _not_configured()
    for needle in ("DEEPSEEK_API_KEY", "DSH_MODEL_API_KEY", "dsh demo"):
        assert needle in error.message


def test_deepseek_key_is_never_used_for_another_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only DEEPSEEK_API_KEY plus DSH_MODEL_BASE_URL=http://127.0.0.1:... is MODEL_NOT_CONFIGURED, without the key."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", DEEPSEEK_KEY)
    monkeypatch.setenv("DSH_MODEL_BASE_URL", "http://127.0.0.1:8999/v1")
    error = _not_configured()
    assert "127.0.0.1" in error.message
    assert "DSH_MODEL_API_KEY" in error.message
    assert DEEPSEEK_KEY not in str(error)
    assert DEEPSEEK_KEY not in repr(error)


def test_custom_endpoint_uses_the_dsh_key_and_a_generic_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSH_MODEL_API_KEY with a custom base URL resolves, and the provider is `openai-compatible`."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", DEEPSEEK_KEY)
    monkeypatch.setenv("DSH_MODEL_BASE_URL", "http://127.0.0.1:8999/v1")
    monkeypatch.setenv("DSH_MODEL_API_KEY", DSH_KEY)
    settings = _resolved()
    assert settings.api_key.get_secret_value() == DSH_KEY
    assert (settings.base_url, settings.provider, settings.key_source) == (
        "http://127.0.0.1:8999/v1",
        "openai-compatible",
        "api_key",
    )


def test_dsh_model_variables_win_over_deepseek_key_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSH_MODEL* values beat DEEPSEEK_API_KEY and the defaults; DSH_MODEL is the model name."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", DEEPSEEK_KEY)
    monkeypatch.setenv("DSH_MODEL_API_KEY", DSH_KEY)
    monkeypatch.setenv("DSH_MODEL", "deepseek-reasoner")
    monkeypatch.setenv("DSH_MODEL_PROVIDER", "my-gateway")
    monkeypatch.setenv("DSH_MODEL_TIMEOUT_S", "7.5")
    monkeypatch.setenv("DSH_MODEL_MAX_RETRIES", "0")
    monkeypatch.setenv("DSH_MODEL_MAX_TOKENS", "2048")
    settings = _resolved()
    assert settings.api_key.get_secret_value() == DSH_KEY
    assert settings.key_source == "api_key"
    assert (settings.model, settings.provider) == ("deepseek-reasoner", "my-gateway")
    assert (settings.timeout_s, settings.max_retries, settings.max_tokens) == (7.5, 0, 2048)


def test_caller_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overrides (CLI flags) beat DSH_MODEL*; a flag key may go to any host."""
    monkeypatch.setenv("DSH_MODEL_API_KEY", DSH_KEY)
    monkeypatch.setenv("DSH_MODEL", "env-model")
    monkeypatch.setenv("DSH_MODEL_MAX_RETRIES", "5")
    settings = _resolved(
        base_url="http://localhost:9000/v1",
        api_key=FLAG_KEY,
        model="flag-model",
        provider="flag-provider",
        timeout_s=3.0,
        max_retries=1,
        max_tokens=10,
    )
    assert settings.api_key.get_secret_value() == FLAG_KEY
    assert settings.key_source == "override"
    assert (settings.base_url, settings.model, settings.provider) == (
        "http://localhost:9000/v1",
        "flag-model",
        "flag-provider",
    )
    assert (settings.timeout_s, settings.max_retries, settings.max_tokens) == (3.0, 1, 10)


def test_flag_base_url_elsewhere_drops_the_deepseek_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `--base-url` away from DeepSeek with only DEEPSEEK_API_KEY is MODEL_NOT_CONFIGURED too."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", DEEPSEEK_KEY)
    _not_configured(base_url="https://gateway.example/v1")


def test_nested_variable_wins_over_its_flat_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSH_MODEL__MODEL (the canonical spelling) beats the flat DSH_MODEL when both are set."""
    monkeypatch.setenv("DSH_MODEL_API_KEY", DSH_KEY)
    monkeypatch.setenv("DSH_MODEL", "flat")
    monkeypatch.setenv("DSH_MODEL__MODEL", "nested")
    assert _resolved().model == "nested"


@pytest.mark.parametrize(
    "url",
    ["api.deepseek.com", "ftp://api.deepseek.com", "https://", "http://host:99999/v1", "not a url", ""],
)
def test_malformed_base_url_is_not_configured(url: str) -> None:
    """A base URL that is not http(s) with a host (or has a bad port) is MODEL_NOT_CONFIGURED."""
    with pytest.raises(ModelError) as caught:
        resolve_model_settings(ModelConfig(base_url=url, api_key=DSH_KEY))
    assert caught.value.code == "MODEL_NOT_CONFIGURED"
    assert "dsh demo" in caught.value.message


def test_explicit_config_needs_no_environment() -> None:
    """A `ModelConfig` built in Python resolves on its own; an empty key counts as no key."""
    settings = resolve_model_settings(ModelConfig(base_url="https://API.DeepSeek.com/", api_key=SecretStr(DSH_KEY)))
    assert (settings.host, settings.provider) == ("api.deepseek.com", "deepseek")
    with pytest.raises(ModelError):
        resolve_model_settings(ModelConfig(api_key=""))


def test_key_stays_out_of_reprs_errors_and_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No key appears in the repr/str of the config, the settings or the client, in errors, or in DEBUG logs."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("DEEPSEEK_API_KEY", DEEPSEEK_KEY)
    monkeypatch.setenv("DSH_MODEL_API_KEY", DSH_KEY)
    config = Config()
    settings = resolve_model_settings(config.model)
    flagged = resolve_model_settings(config.model, api_key=FLAG_KEY)
    client = OpenAICompatibleClient(settings)
    monkeypatch.setenv("DSH_MODEL_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.delenv("DSH_MODEL_API_KEY")
    refused = _not_configured()

    shown = [repr(config), str(config), repr(config.model), str(config.model), repr(settings), str(settings)]
    shown += [repr(flagged), repr(client), str(refused), repr(refused), caplog.text]
    for secret in SECRETS:
        assert all(secret not in text for text in shown)
