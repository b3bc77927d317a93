"""Typed configuration: defaults, strict Python values, environment parsing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from dsh.config import (
    DEFAULT_COLD_READ_CONCURRENCY,
    DEFAULT_MODEL,
    DEFAULT_MODEL_BASE_URL,
    CacheConfig,
    Config,
    ModelConfig,
    PersistenceConfig,
    ServerConfig,
    SubagentConfig,
    default_home,
)
from dsh.errors import ConfigError, DshError


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without DSH_* variables, so the developer's shell cannot leak in."""
    for name in list(os.environ):
        if name.startswith("DSH_"):
            monkeypatch.delenv(name)


def _invalid(factory: Any, **values: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        factory(**values)
    assert caught.value.code == "CONFIG_INVALID"
    assert isinstance(caught.value, DshError)
    assert isinstance(caught.value, ValueError)
    return caught.value


def test_every_field_has_its_default() -> None:
    """Config() with no arguments and no DSH_* variables gives every field its default value."""
    config = Config()
    assert config.home == Path.home() / ".local" / "share" / "dsh" == default_home()
    assert config.database_url is None
    assert config.persistence.write_batch_max_delay_ms == 200
    assert config.persistence.compression == "zstd"
    assert config.cache.write_every_events == 200
    assert config.cache.write_interval_ms == 5000
    assert config.cache.idle_ms == 1000
    assert config.subagent.cold_read_concurrency == 4 == DEFAULT_COLD_READ_CONCURRENCY
    assert config.subagent.max_depth == 3
    assert config.server.host == "127.0.0.1"
    assert config.server.port == 8765
    assert config.sessions_dir == config.home / "sessions"
    assert config.cache_path == config.home / "cache.sqlite3"


def test_python_values_are_accepted_when_well_typed(tmp_path: Path) -> None:
    """Keyword values of the right type are kept; sections accept models or mappings."""
    config = Config(
        home=tmp_path,
        database_url="sqlite:///x.sqlite3",
        subagent=SubagentConfig(cold_read_concurrency=64, max_depth=0),
        server={"port": 9000},
    )
    assert config.home == tmp_path
    assert config.database_url == "sqlite:///x.sqlite3"
    assert config.subagent.cold_read_concurrency == 64
    assert config.server.port == 9000
    assert Config(home=str(tmp_path)).home == tmp_path
    assert Config(home="~/dsh-x").home == Path.home() / "dsh-x"


@pytest.mark.parametrize("value", [True, False, 4.0, "4", None, [4]])
def test_int_fields_refuse_non_int_python_values(value: object) -> None:
    """A bool, a float or the string "4" for an int field is refused with CONFIG_INVALID."""
    _invalid(SubagentConfig, cold_read_concurrency=value)
    _invalid(PersistenceConfig, write_batch_max_delay_ms=value)
    _invalid(CacheConfig, write_every_events=value)
    _invalid(ServerConfig, port=value)


@pytest.mark.parametrize("value", [0, 65, -1])
def test_cold_read_concurrency_range(value: int) -> None:
    """subagent.cold_read_concurrency must lie in 1..64."""
    error = _invalid(SubagentConfig, cold_read_concurrency=value)
    assert "cold_read_concurrency" in error.message
    assert SubagentConfig(cold_read_concurrency=1).cold_read_concurrency == 1


def test_nested_strictness_through_config() -> None:
    """Strictness holds for section values given to Config as mappings."""
    _invalid(Config, subagent={"cold_read_concurrency": "4"})
    _invalid(Config, subagent={"cold_read_concurrency": 0})
    _invalid(Config, server={"port": True})


@pytest.mark.parametrize(
    "values",
    [{"home": ""}, {"home": 5}, {"database_url": 5}, {"unknown": 1}, {"subagent": {"unknown": 1}}],
)
def test_other_invalid_values(values: dict[str, Any]) -> None:
    """Empty or mistyped home, non-string database URLs and unknown fields are refused."""
    _invalid(Config, **values)


def test_config_is_frozen(tmp_path: Path) -> None:
    """A built Config cannot be changed."""
    config = Config(home=tmp_path)
    with pytest.raises(Exception):
        config.home = Path("/elsewhere")  # type: ignore[misc]


def test_env_section_values_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSH_SUBAGENT__COLD_READ_CONCURRENCY=8 is parsed to the int 8; other fields keep defaults."""
    monkeypatch.setenv("DSH_SUBAGENT__COLD_READ_CONCURRENCY", "8")
    monkeypatch.setenv("DSH_SERVER__HOST", "0.0.0.0")
    monkeypatch.setenv("DSH_CACHE__CLOSE_TIMEOUT_S", "2.5")
    config = Config()
    assert config.subagent.cold_read_concurrency == 8
    assert type(config.subagent.cold_read_concurrency) is int
    assert config.subagent.max_depth == 3
    assert config.server.host == "0.0.0.0"
    assert config.cache.close_timeout_s == 2.5


def test_env_flat_aliases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """DSH_HOME and DSH_DATABASE_URL are read as the home folder and the backend URL."""
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DSH_DATABASE_URL", "postgresql://db/dsh")
    config = Config()
    assert config.home == tmp_path / "home"
    assert config.database_url == "postgresql://db/dsh"
    assert config.sessions_dir == tmp_path / "home" / "sessions"


def test_python_values_win_over_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An explicit keyword value overrides the environment."""
    monkeypatch.setenv("DSH_HOME", "/from/env")
    assert Config(home=tmp_path).home == tmp_path


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DSH_SUBAGENT__COLD_READ_CONCURRENCY", "many"),
        ("DSH_SUBAGENT__COLD_READ_CONCURRENCY", "0"),
        ("DSH_SUBAGENT__COLD_READ_CONCURRENCY", "65"),
        ("DSH_SUBAGENT__COLD_READ_CONCURRENCY", "4.5"),
        ("DSH_SERVER__PORT", "70000"),
        ("DSH_PERSISTENCE__WRITE_BATCH_MAX_DELAY_MS", ""),
        ("DSH_CACHE__WRITE_EVERY_EVENTS", "-3"),
        ("DSH_PERSISTENCE__COMPRESSION", "gzip"),
    ],
)
def test_invalid_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """An unparsable or out-of-range environment value is CONFIG_INVALID naming the variable."""
    monkeypatch.setenv(name, value)
    error = _invalid(Config)
    assert name in error.message


def test_the_encoding_of_new_logs_comes_from_persistence_compression(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`DSH_PERSISTENCE__COMPRESSION=none` (or the keyword) makes the JSONL store create plain logs."""
    from dsh.runtime import backend_for

    monkeypatch.setenv("DSH_PERSISTENCE__COMPRESSION", "none")
    assert Config(home=tmp_path).persistence.compression == "none"
    assert backend_for(Config(home=tmp_path)).compression == "none"  # type: ignore[attr-defined]
    monkeypatch.delenv("DSH_PERSISTENCE__COMPRESSION")
    assert backend_for(Config(home=tmp_path)).compression == "zstd"  # type: ignore[attr-defined]
    assert Config(home=tmp_path, persistence={"compression": "none"}).persistence.compression == "none"
    assert "compression" in _invalid(PersistenceConfig, compression="lz4").message


# ---------------------------------------------------------------- the model section


@pytest.fixture
def _no_deepseek_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model-section tests also start without DEEPSEEK_API_KEY."""
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)


@pytest.mark.usefixtures("_no_deepseek_key")
def test_model_section_defaults() -> None:
    """The model section defaults to DeepSeek's endpoint and model, no key, 120 s, 2 retries, no token limit."""
    model = Config().model
    assert model == ModelConfig()
    assert (model.base_url, model.model) == (DEFAULT_MODEL_BASE_URL, DEFAULT_MODEL)
    assert (model.base_url, model.model) == ("https://api.deepseek.com", "deepseek-chat")
    assert model.api_key is None
    assert model.deepseek_api_key is None
    assert model.provider is None
    assert (model.timeout_s, model.max_retries, model.max_tokens) == (120.0, 2, None)


@pytest.mark.parametrize(
    "values",
    [
        {"timeout_s": True},
        {"timeout_s": "5"},
        {"timeout_s": 0},
        {"max_retries": 2.0},
        {"max_retries": "2"},
        {"max_retries": -1},
        {"max_tokens": 0},
        {"max_tokens": False},
        {"api_key": 5},
        {"base_url": None},
        {"model": ["deepseek-chat"]},
        {"unknown": 1},
    ],
)
def test_model_section_is_strict_for_python_values(values: dict[str, Any]) -> None:
    """Mistyped or out-of-range model values given in Python are refused with CONFIG_INVALID."""
    _invalid(ModelConfig, **values)
    _invalid(Config, model=values)


def test_model_section_accepts_well_typed_python_values() -> None:
    """A str key becomes a SecretStr (masked in repr); an int timeout is taken as seconds."""
    model = ModelConfig(api_key="sk-python-value", timeout_s=30, max_tokens=512, provider="gw")
    assert isinstance(model.api_key, SecretStr)
    assert model.api_key.get_secret_value() == "sk-python-value"
    assert "sk-python-value" not in repr(model)
    assert (model.timeout_s, model.max_tokens, model.provider) == (30, 512, "gw")


@pytest.mark.usefixtures("_no_deepseek_key")
def test_model_flat_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSH_MODEL names the model (not JSON for the section); the other flat names and DEEPSEEK_API_KEY are parsed."""
    monkeypatch.setenv("DSH_MODEL", "deepseek-reasoner")
    monkeypatch.setenv("DSH_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("DSH_MODEL_API_KEY", "sk-flat")
    monkeypatch.setenv("DSH_MODEL_PROVIDER", "local")
    monkeypatch.setenv("DSH_MODEL_TIMEOUT_S", "2.5")
    monkeypatch.setenv("DSH_MODEL_MAX_RETRIES", "0")
    monkeypatch.setenv("DSH_MODEL_MAX_TOKENS", "100")
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-deepseek")
    model = Config().model
    assert (model.model, model.base_url, model.provider) == ("deepseek-reasoner", "http://127.0.0.1:9/v1", "local")
    assert model.api_key is not None
    assert model.api_key.get_secret_value() == "sk-flat"
    assert model.deepseek_api_key is not None
    assert model.deepseek_api_key.get_secret_value() == "sk-deepseek"
    assert (model.timeout_s, model.max_retries, model.max_tokens) == (2.5, 0, 100)
    assert type(model.max_retries) is int


@pytest.mark.usefixtures("_no_deepseek_key")
def test_model_nested_environment_names_win_over_flat_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSH_MODEL__<FIELD> is read like every section and beats the flat name; an empty flat name is unset."""
    monkeypatch.setenv("DSH_MODEL__MAX_TOKENS", "64")
    monkeypatch.setenv("DSH_MODEL_MAX_TOKENS", "128")
    monkeypatch.setenv("DSH_MODEL__API_KEY", "sk-nested")
    monkeypatch.setenv("DSH_MODEL", "")
    model = Config().model
    assert model.max_tokens == 64
    assert model.api_key is not None
    assert model.api_key.get_secret_value() == "sk-nested"
    assert model.model == "deepseek-chat"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DSH_MODEL_TIMEOUT_S", "soon"),
        ("DSH_MODEL_TIMEOUT_S", "0"),
        ("DSH_MODEL_MAX_RETRIES", "-1"),
        ("DSH_MODEL_MAX_RETRIES", "1.5"),
        ("DSH_MODEL_MAX_TOKENS", "0"),
        ("DSH_MODEL__TIMEOUT_S", "x"),
    ],
)
def test_invalid_model_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """An unparsable or out-of-range model variable is CONFIG_INVALID naming the variable."""
    monkeypatch.setenv(name, value)
    error = _invalid(Config)
    assert name in error.message
