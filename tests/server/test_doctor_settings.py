"""`dsh doctor`'s server and model checks: the token file's mode, the model key (never shown), the base URL
and, with `--online`, `GET /models`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.doctor import run_doctor
from dsh.server.security import load_token
from dsh.testing.fake_openai import FakeOpenAIServer

SECRET_KEY = "sk-doctor-secret-7731"


def _checks(report: Any) -> dict[str, tuple[str, str]]:
    return {check.name: (check.status, check.detail) for check in report.checks}


async def test_the_token_file_check_follows_its_mode(tmp_path: Path) -> None:
    """No token file is fine; a 0600 one is ok; a group- or other-readable one fails (exit 7)."""
    home = tmp_path / "home"
    home.mkdir()
    assert _checks(await run_doctor(Config(home=home)))["serve-token"][0] == "ok"
    token = load_token(home)
    assert _checks(await run_doctor(Config(home=home)))["serve-token"] == ("ok", f"{token.path} has mode 0600")
    token.path.chmod(0o640)
    report = await run_doctor(Config(home=home))
    status, detail = _checks(report)["serve-token"]
    assert status == "fail"
    assert "chmod 600" in detail
    assert report.status == "fail"
    assert token.value not in json.dumps(report.to_json())


async def test_model_settings_are_checked_without_showing_the_key(tmp_path: Path) -> None:
    """A configured key is reported by its variable, never its value; a malformed base URL fails."""
    home = tmp_path / "home"
    home.mkdir()
    configured = Config(home=home, model={"api_key": SECRET_KEY, "base_url": "http://127.0.0.1:9/v1"})
    report = await run_doctor(configured)
    checks = _checks(report)
    assert checks["model-key"] == ("ok", "a key is set (DSH_MODEL_API_KEY) for 127.0.0.1")
    assert checks["model-url"][0] == "ok"
    assert "model-online" not in checks
    assert SECRET_KEY not in json.dumps(report.to_json())
    broken = await run_doctor(Config(home=home, model={"api_key": SECRET_KEY, "base_url": "ftp:/nowhere"}))
    assert _checks(broken)["model-url"][0] == "fail"
    keyless = await run_doctor(Config(home=home, model={"api_key": None, "deepseek_api_key": None}))
    assert "no model key is set" in _checks(keyless)["model-key"][1]


async def test_online_asks_the_endpoint_for_its_models(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """`online` calls `GET /models` with the key (ok), and an endpoint that refuses the connection fails."""
    home = tmp_path / "home"
    home.mkdir()
    config = Config(home=home, model={"api_key": SECRET_KEY, "base_url": openai_server.base_url})
    report = await run_doctor(config, online=True)
    assert _checks(report)["model-online"] == ("ok", "GET /models answered with 1 models")
    request = openai_server.requests[-1]
    assert (request.method, request.path) == ("GET", "/v1/models")
    assert request.headers["authorization"] == f"Bearer {SECRET_KEY}"
    offline = Config(home=home, model={"api_key": SECRET_KEY, "base_url": "http://127.0.0.1:9/v1"})
    status, detail = _checks(await run_doctor(offline, online=True))["model-online"]
    assert status == "fail"
    assert detail.startswith("GET /models failed: ")
    assert SECRET_KEY not in detail


def test_dsh_doctor_online_flag_reaches_the_endpoint_and_prints_no_key(
    tmp_path: Path, openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dsh doctor --json --online` reports the `GET /models` check; the key is sent, never printed."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DSH_MODEL_API_KEY", SECRET_KEY)
    monkeypatch.setenv("DSH_MODEL_BASE_URL", openai_server.base_url)
    result = CliRunner().invoke(app, ["--home", str(home), "doctor", "--json", "--online"])
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["model-online"]["status"] == "ok", result.stdout
    assert [(request.method, request.path) for request in openai_server.requests] == [("GET", "/v1/models")]
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {SECRET_KEY}"
    assert SECRET_KEY not in result.stdout
    assert SECRET_KEY not in result.stderr
    offline = CliRunner().invoke(app, ["--home", str(home), "doctor", "--json"])
    assert "model-online" not in {check["name"] for check in json.loads(offline.stdout)["checks"]}
    assert len(openai_server.requests) == 1
