"""Configuration files: the user's and the workspace's `config.toml`, the environment, and `dsh config`.

Precedence is environment > workspace file > user file > defaults (command-line flags above all).
`dsh config` prints every effective value with where it came from and never a secret. A TOML syntax
error names the file, line and column; an invalid value the file and the key path. A library
`Config()` reads no file at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.config_files import load
from dsh.errors import ConfigError

runner = CliRunner()

SECRET = "sk-very-secret-value"


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A user file (through `XDG_CONFIG_HOME`) and a workspace with its `.dsh/config.toml`; no DSH_* variables."""
    for name in list(os.environ):
        if name.startswith("DSH_") or name == "DEEPSEEK_API_KEY":
            monkeypatch.delenv(name)
    user = tmp_path / "config" / "dsh" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text(
        f'[model]\nmodel = "user-model"\napi_key = "{SECRET}"\ntimeout_s = 30\n[agent]\nmax_steps = 7\n',
        encoding="utf-8",
    )
    workspace = tmp_path / "project"
    (workspace / ".dsh").mkdir(parents=True)
    (workspace / ".dsh" / "config.toml").write_text(
        'sandbox = "off"\n[model]\nmodel = "workspace-model"\n[[approvals.rules]]\ntool = "bash"\npattern = "pytest*"\n'
        'action = "allow"\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return user, workspace


def _settings(output: str) -> dict[str, dict[str, object]]:
    return {item["key"]: item for item in json.loads(output)["settings"]}


def test_dsh_config_shows_each_value_with_its_source(files: tuple[Path, Path], tmp_path: Path) -> None:
    """Values from the user file, the workspace file and the environment each name their source."""
    user, workspace = files
    env = {"DSH_MODEL_TIMEOUT_S": "45", "DSH_AGENT__LOG_CHUNKS": "true"}
    result = runner.invoke(
        app, ["--home", str(tmp_path / "home"), "config", "--workspace", str(workspace), "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    settings = _settings(result.stdout)
    assert settings["model.model"] == {
        "key": "model.model",
        "value": "workspace-model",
        "source": f"workspace file {workspace / '.dsh' / 'config.toml'}",
    }
    assert settings["agent.max_steps"]["source"] == f"user file {user}"
    assert settings["model.timeout_s"] == {
        "key": "model.timeout_s",
        "value": 45.0,
        "source": "environment DSH_MODEL_TIMEOUT_S",
    }
    assert settings["agent.log_chunks"]["source"] == "environment DSH_AGENT__LOG_CHUNKS"
    assert settings["sandbox.mode"]["value"] == "danger-full-access"
    assert settings["approvals.rules"]["value"] == [{"tool": "bash", "pattern": "pytest*", "action": "allow"}]
    assert settings["home"]["source"] == "command line"
    assert settings["server.port"] == {"key": "server.port", "value": 8765, "source": "default"}
    assert settings["model.api_key"]["value"] == "***"
    text = runner.invoke(app, ["config", "--workspace", str(workspace)], env=env)
    assert text.exit_code == 0
    assert "model.model" in text.stdout
    assert "workspace-model" in text.stdout
    assert "environment DSH_MODEL_TIMEOUT_S" in text.stdout
    for output in (result.stdout, result.stderr, text.stdout, text.stderr):
        assert SECRET not in output


def test_no_secret_is_printed_from_the_environment_or_a_database_url(files: tuple[Path, Path]) -> None:
    """A key set in the environment shows `***`; a database URL shows its password as `***`."""
    _, workspace = files
    env = {"DEEPSEEK_API_KEY": "sk-from-env-secret"}
    result = runner.invoke(
        app,
        ["--database-url", "postgresql://me:hunter2@db/x", "config", "--workspace", str(workspace), "--json"],
        env=env,
    )
    assert result.exit_code == 0, result.output
    settings = _settings(result.stdout)
    assert settings["model.deepseek_api_key"]["value"] == "***"
    assert settings["database_url"]["value"] == "postgresql://me:***@db/x"
    assert "sk-from-env-secret" not in result.output
    assert "hunter2" not in result.output


def test_a_toml_syntax_error_names_the_file_line_and_column(files: tuple[Path, Path]) -> None:
    """A broken workspace file is one error line with the file, the line and the column; exit 4."""
    _, workspace = files
    broken = workspace / ".dsh" / "config.toml"
    broken.write_text('[model]\nmodel = "ok"\ntimeout_s = = 3\n', encoding="utf-8")
    result = runner.invoke(app, ["config", "--workspace", str(workspace)])
    assert result.exit_code == 4
    assert f"error [CONFIG_INVALID]: invalid config file {broken}: line 3, column 13:" in result.stderr


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("[model]\ntimeout_s = -1\n", "model.timeout_s: Input should be greater than 0 (got -1)"),
        ('[model]\nmax_retries = "2"\n', "model.max_retries: Input should be a valid integer"),
        ('[approvals]\nrules = [{tool = "bash", action = "perhaps"}]\n', "approvals.rules.0: "),
        ("[modle]\nmodel = 'x'\n", "modle: unknown setting"),
        ("[model]\ntimout_s = 3\n", "model.timout_s: unknown setting"),
    ],
)
def test_an_invalid_value_names_the_file_and_its_key_path(files: tuple[Path, Path], content: str, where: str) -> None:
    """A wrong type, a value out of range or an unknown key names the file and where the value sits."""
    user, workspace = files
    user.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load(workspace=workspace)
    assert raised.value.message.startswith(f"invalid config file {user}: ")
    assert where in raised.value.message


def test_a_secret_is_masked_in_an_invalid_value_too(files: tuple[Path, Path]) -> None:
    """Even an invalid key value is not echoed back."""
    user, workspace = files
    user.write_text("[model]\napi_key = 12345678\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load(workspace=workspace)
    assert "12345678" not in raised.value.message
    assert "model.api_key" in raised.value.message


def test_the_environment_beats_the_workspace_which_beats_the_user_file(
    files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same setting in all three places takes the environment's value; without it, the workspace's."""
    _, workspace = files
    assert load(workspace=workspace).model.model == "workspace-model"
    assert load().model.model == "user-model"
    monkeypatch.setenv("DSH_MODEL", "env-model")
    assert load(workspace=workspace).model.model == "env-model"
    assert load(workspace=workspace, overrides={"model.model": "flag-model"}).model.model == "flag-model"


def test_a_library_config_reads_no_file(files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """`Config()` ignores both files, even with the workspace as the current folder; `load` reads them."""
    _, workspace = files
    monkeypatch.chdir(workspace)
    assert Config().model.model == "deepseek-chat"
    assert Config().sandbox.mode == "workspace-write"
    assert load(workspace=workspace).model.model == "workspace-model"
    assert load(workspace=workspace, read_user_file=False).model.api_key is None
