"""The lint policy for `src/`: private members stay private, and every exception is inline with its reason.

ruff's `SLF001` (no access to another object's `_`-prefixed members) is selected for the whole tree
and no per-file ignore switches it off for a source file; an exception is an inline `# noqa` naming
its rule and its reason, and the session layer has none (docs/architecture.md#import-rules).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
_SOURCES = sorted((_ROOT / "src" / "dsh").rglob("*.py"))

# An inline noqa comment names its rules, then gives its reason after " - " or "  # " (at least one word).
_NOQA = re.compile(r"#\s*noqa\b(?P<rules>:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)$")
_REASON = re.compile(r"^\s*(?:-|#)\s*\w+")


def _lint_settings() -> dict[str, Any]:
    return tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]


def _switches_off_slf001(rules: list[str]) -> bool:
    return any(rule in {"SLF", "SLF0", "SLF00", "SLF001"} for rule in rules)


def test_slf001_is_selected_and_not_ignored() -> None:
    """`SLF` is in ruff's selection and not in its global ignore list."""
    lint = _lint_settings()
    assert "SLF" in lint["select"] or "SLF001" in lint["select"]
    assert not _switches_off_slf001(lint.get("ignore", []))


def test_no_per_file_ignore_switches_slf001_off_for_a_source_file() -> None:
    """No `per-file-ignores` pattern that matches a file under `src/` lists `SLF001`."""
    ignores: dict[str, list[str]] = _lint_settings().get("per-file-ignores", {})
    sources = [str(path.relative_to(_ROOT)) for path in _SOURCES]
    offending = sorted(
        pattern
        for pattern, rules in ignores.items()
        if _switches_off_slf001(rules) and any(fnmatch.fnmatch(source, pattern) for source in sources)
    )
    assert offending == []


def test_every_noqa_in_src_names_its_rule_and_reason() -> None:
    """Each inline `# noqa` under `src/dsh` names the rules it silences and says why."""
    bare: list[str] = []
    for path in _SOURCES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            found = _NOQA.search(line)
            if found and not (found["rules"] and _REASON.match(found["rest"])):
                bare.append(f"{path.relative_to(_ROOT)}:{number}: {line.strip()}")
    assert bare == []


def test_the_session_layer_has_no_noqa() -> None:
    """No line of `dsh.session` silences a lint rule: it follows every rule, `SLF001` included."""
    session = [path for path in _SOURCES if path.parent.name == "session"]
    assert session
    silenced = [
        f"{path.relative_to(_ROOT)}:{number}"
        for path in session
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if _NOQA.search(line)
    ]
    assert silenced == []


def test_the_noqa_pattern_tells_reasons_apart() -> None:
    """The checker accepts a rule with a reason and rejects a bare noqa, a missing rule or a missing reason."""

    def accepted(line: str) -> bool:
        found = _NOQA.search(line)
        return found is not None and bool(found["rules"]) and _REASON.match(found["rest"]) is not None

    assert accepted("x = 1  # noqa: SLF001  # the record's own table")
    assert accepted("x = 1  # noqa: S104 - compared, never bound")
    assert accepted("x = 1  # noqa: N818, B018 - an abort reason")
    assert not accepted("x = 1  # noqa: ASYNC110")
    assert not accepted("x = 1  # noqa")
    assert not accepted("x = 1  # noqa - because")
