"""Configuration files: the user's and the workspace's `config.toml`, merged under the environment.

Layer: base (beside `dsh.config`). `load()` reads, in rising precedence, the
user file (`$XDG_CONFIG_HOME/dsh/config.toml`, else `~/.config/dsh/config.toml`), the workspace
file (`<workspace>/.dsh/config.toml`), the environment and the caller's overrides (command-line
flags), and remembers where every setting came from, which `dsh config` prints
(docs/cli.md#configuration-files). The files are read with pydantic-settings' TOML source. Each
file is checked on its own before anything is merged, so an unknown key or a wrong value is
reported with the file and the key path it sits at, and a TOML syntax error with the file, line and
column. `Config()` never comes here: a library user's configuration is only what it passes and the
environment. The CLI calls `load` for every command.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import orjson
from pydantic import SecretStr, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import TomlConfigSettingsSource

from dsh.config import _FLAT, _FLAT_SECTION_FIELDS, _SECTIONS, Config, _EnvironmentSource, config_file_paths
from dsh.errors import ConfigError

__all__ = ["LoadedConfig", "Setting", "load", "load_config"]

DEFAULT_SOURCE: Final = "default"
FLAG_SOURCE: Final = "command line"
_MASK: Final = "***"
_TOML_POSITION: Final = re.compile(r"\(at line (\d+), column (\d+)\)")


@dataclass(frozen=True, slots=True)
class Setting:
    """One effective setting: its dotted key, the value as shown (secrets masked), and where it came from."""

    key: str
    value: object
    source: str


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A configuration and the source of each of its settings.

    Attributes:
        config: The effective configuration.
        sources: Dotted key → `default`, `user file <path>`, `workspace file <path>`,
            `environment <NAME>` or `command line`.
        files: The configuration files that were read, lowest precedence first.
    """

    config: Config
    sources: Mapping[str, str]
    files: tuple[Path, ...]

    def settings(self) -> list[Setting]:
        """Every setting in declaration order, secrets masked (a set secret shows `***`)."""
        out: list[Setting] = []
        for key, value in _leaves(self.config):
            out.append(Setting(key, _shown(value, key), self.sources.get(key, DEFAULT_SOURCE)))
        return out


def load(
    *,
    workspace: str | os.PathLike[str] | None = None,
    user_file: str | os.PathLike[str] | None = None,
    read_user_file: bool = True,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """The configuration from the files, the environment and `overrides` (dotted keys: `model.model`).

    Precedence, highest first: `overrides` (command-line flags), the environment, the workspace's
    `.dsh/config.toml`, the user's `~/.config/dsh/config.toml`, the defaults.

    Raises:
        ConfigError: `CONFIG_INVALID` naming the file and line/column of a TOML syntax error, or the
            file and key path of an invalid value.
    """
    return load_config(
        workspace=Path(workspace) if workspace is not None else None,
        user_file=Path(user_file) if user_file is not None else None,
        read_user_file=read_user_file,
        overrides=overrides or {},
    ).config


def load_config(
    *, workspace: Path | None, user_file: Path | None, read_user_file: bool, overrides: Mapping[str, Any]
) -> LoadedConfig:
    """Like `load`, with where each setting came from (what `dsh config` prints)."""
    layers: list[tuple[str, dict[str, Any]]] = []
    files: list[Path] = []
    default_user, workspace_file = config_file_paths(workspace)
    if read_user_file:
        path = user_file if user_file is not None else default_user
        if path.is_file():
            layers.append((f"user file {path}", _read_file(path)))
            files.append(path)
    if workspace_file is not None and workspace_file.is_file():
        layers.append((f"workspace file {workspace_file}", _read_file(workspace_file)))
        files.append(workspace_file)
    environment = _EnvironmentSource(Config)()
    layers.append(("environment", _environment_values(environment)))
    layers.append((FLAG_SOURCE, _override_values(overrides)))
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    env_names = _environment_names()
    for label, values in layers:
        for key, value in _flatten(values):
            section, _, field = key.partition(".")
            if field:
                merged.setdefault(section, {})[field] = value
            else:
                merged[section] = value
            sources[key] = f"environment {env_names[key]}" if label == "environment" and key in env_names else label
    config = Config(**merged)
    return LoadedConfig(config, sources, tuple(files))


# ---------------------------------------------------------------- one file


def _read_file(path: Path) -> dict[str, Any]:
    """The checked, typed values of one file (dotted keys grouped by section)."""
    try:
        raw = TomlConfigSettingsSource(Config, toml_file=path).toml_data
    except tomllib.TOMLDecodeError as error:
        text = str(error)
        found = _TOML_POSITION.search(text)
        where = f"line {found.group(1)}, column {found.group(2)}: " if found else ""
        reason = _TOML_POSITION.sub("", text).strip()
        raise ConfigError(f"invalid config file {path}: {where}{reason}") from None
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror or error}") from None
    out: dict[str, Any] = {}
    fields = Config.model_fields
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"invalid config file {path}: {key}: unknown setting")
        section = _SECTIONS.get(key)
        if section is None:
            out[key] = _check_value(path, key, value, fields[key])
            continue
        # `sandbox = "off"` is short for `[sandbox] mode = "off"`.
        table = {"mode": value} if key == "sandbox" and isinstance(value, str) else value
        if not isinstance(table, dict):
            raise ConfigError(f"invalid config file {path}: {key}: expected a table ([{key}])")
        checked: dict[str, Any] = {}
        for name, item in table.items():
            info = section.model_fields.get(name)
            if info is None:
                raise ConfigError(f"invalid config file {path}: {key}.{name}: unknown setting")
            checked[name] = _check_value(path, f"{key}.{name}", item, info)
        out[key] = checked
    return out


def _check_value(path: Path, key: str, value: object, info: FieldInfo) -> object:
    """`value` validated as the field's type, the way JSON input is (TOML's types are JSON's)."""
    if key == "home" and isinstance(value, str):
        if not value:
            raise ConfigError(f"invalid config file {path}: home: must not be empty")
        return Path(value).expanduser()
    target: Any = info.annotation or object
    if info.metadata:
        target = Annotated[(target, *info.metadata)]
    try:
        encoded = orjson.dumps(value)
    except TypeError:
        raise ConfigError(f"invalid config file {path}: {key}: unsupported TOML value") from None
    try:
        return TypeAdapter(target).validate_json(encoded, strict=True)
    except ValidationError as error:
        secret = _is_secret(info)
        problems = []
        for item in error.errors():
            where = ".".join([key, *(str(part) for part in item["loc"])])
            shown = _MASK if secret else repr(item.get("input"))
            problems.append(f"{where}: {item['msg']} (got {shown})")
        raise ConfigError(f"invalid config file {path}: " + "; ".join(problems)) from None


def _is_secret(info: FieldInfo) -> bool:
    return "SecretStr" in repr(info.annotation)


# ---------------------------------------------------------------- environment and overrides


def _environment_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The environment source's result as plain values: only the fields it set."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in _SECTIONS:
            out[key] = {name: getattr(value, name) for name in value.model_fields_set}
        elif key == "home":
            out[key] = Path(value).expanduser()
        else:
            out[key] = value
    return out


def _environment_names() -> dict[str, str]:
    """Dotted key → the variable that set it, with the environment source's precedence (nested wins)."""
    env = os.environ
    names: dict[str, str] = {field: name for name, field in _FLAT.items() if env.get(name)}
    for name, (section, field) in _FLAT_SECTION_FIELDS.items():
        if env.get(name):
            names[f"{section}.{field}"] = name
    for section, model in _SECTIONS.items():
        for field in model.model_fields:
            name = f"DSH_{section.upper()}__{field.upper()}"
            if env.get(name) is not None:
                names[f"{section}.{field}"] = name
    return names


def _override_values(overrides: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if field:
            if section not in _SECTIONS or field not in _SECTIONS[section].model_fields:
                raise ConfigError(f"unknown setting {key}")
            out.setdefault(section, {})[field] = value
        else:
            if key not in Config.model_fields or key in _SECTIONS:
                raise ConfigError(f"unknown setting {key}")
            out[key] = Path(value).expanduser() if key == "home" and isinstance(value, str) else value
    return out


def _flatten(values: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in values.items():
        if key in _SECTIONS and isinstance(value, dict):
            out.extend((f"{key}.{name}", item) for name, item in value.items())
        else:
            out.append((key, value))
    return out


# ---------------------------------------------------------------- showing settings


def _leaves(config: Config) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for name in Config.model_fields:
        value = getattr(config, name)
        if name in _SECTIONS:
            out.extend((f"{name}.{field}", getattr(value, field)) for field in type(value).model_fields)
        else:
            out.append((name, value))
    return out


def _shown(value: object, key: str = "") -> object:
    """A JSON-friendly form of a setting; a secret shows only whether it is set."""
    if key == "database_url" and isinstance(value, str):
        return _mask_password(value)
    if isinstance(value, SecretStr):
        return _MASK if value.get_secret_value() else ""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_shown(item) for item in value]
    if isinstance(value, dict):
        return {name: _shown(item, "mcp.server" if key == "mcp.servers" else "") for name, item in value.items()}
    if hasattr(value, "model_dump"):
        dumped = value.model_dump(mode="json")
        if key == "mcp.server":
            # Header and environment values may hold a secret written in place: show only the names.
            for field in ("headers", "env"):
                dumped[field] = dict.fromkeys(dumped.get(field, {}), _MASK)
        return dumped
    return value


def _mask_password(url: str) -> str:
    """`url` with the password of its user-info part replaced by `***`."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return _MASK
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{_MASK}@{host}{port}"))
