"""The TypeScript harness as a process the tests talk to: its pinned sources, our driver, JSON lines.

Layer: tests (interop). `HarnessProcess.start(toolchain, workdir)` copies the pinned harness sources
(`../shared/upstream-dsh` beside the repository, or `$DSH_UPSTREAM_DSH`) into `workdir`, links the
toolchain's `node_modules` above the copy (where the harness's imports of `zod` and the `tsx`
loader are resolved), puts our drivers (`tests/interop/drivers/*.ts`) into `<copy>/interop/` and
starts `node --import tsx interop/driver.ts` there, so tsx resolves the `@deepseek-ai/*` imports
through the copy's own tsconfig paths. `call(op, ...)` sends one request and returns the
driver's answer; a refusal by the harness raises `HarnessRefused` carrying its error name and
message. The driver's protocol is described at the top of `drivers/driver.ts`.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import subprocess
from pathlib import Path
from typing import IO, Any, Final

from tests.interop.toolchain import Toolchain, ToolchainUnavailable

__all__ = ["HarnessProcess", "HarnessRefused", "upstream_sources"]

REPOSITORY: Final = Path(__file__).resolve().parents[2]
DRIVERS: Final = Path(__file__).resolve().parent / "drivers"
_ANSWER: Final = "@@interop "
_ANSWER_TIMEOUT_S: Final = 300.0
"""A guard against a hung driver, never a timing: one request takes well under a second."""


def upstream_sources() -> Path:
    """The pinned harness sources: `$DSH_UPSTREAM_DSH`, else `../shared/upstream-dsh` beside the repository.

    Raises:
        ToolchainUnavailable: The folder is not there.
    """
    explicit = os.environ.get("DSH_UPSTREAM_DSH")
    folder = Path(explicit) if explicit else REPOSITORY.parent / "shared" / "upstream-dsh"
    if not (folder / "packages" / "session" / "session-persistence-jsonl").is_dir():
        raise ToolchainUnavailable(f"the harness's pinned sources are not at {folder}")
    return folder


class HarnessRefused(Exception):  # noqa: N818 - the harness's own refusal, carried to the test
    """The harness threw: its error's name, message, and its cause's `name: message` when it had one."""

    def __init__(self, name: str, message: str, cause: str | None = None) -> None:
        super().__init__(name, message, cause)
        self.name = name
        self.message = message
        self.cause = cause

    def __str__(self) -> str:
        cause = f" (cause: {self.cause})" if self.cause else ""
        return f"{self.name}: {self.message}{cause}"


class HarnessProcess:
    """One running driver process; `call` is not thread-safe (the tests call it from one thread)."""

    def __init__(self, process: subprocess.Popen[str], workdir: Path) -> None:
        self._process = process
        self._stdin: IO[str] = process.stdin  # type: ignore[assignment]
        self._stdout: IO[str] = process.stdout  # type: ignore[assignment]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._stdout, selectors.EVENT_READ)
        self._next_id = 0
        self.workdir = workdir
        self.log: list[str] = []
        """Lines the harness printed that are not answers (its logger's warnings, for instance)."""

    @classmethod
    def start(cls, toolchain: Toolchain, workdir: Path) -> HarnessProcess:
        """Copy the sources into `workdir`, add the drivers and start the driver process."""
        copy = workdir / "upstream"
        shutil.copytree(upstream_sources(), copy, symlinks=True)
        (workdir / "node_modules").symlink_to(toolchain.modules, target_is_directory=True)
        (copy / "interop").mkdir()
        for driver in DRIVERS.glob("*.ts"):
            shutil.copyfile(driver, copy / "interop" / driver.name)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("NODE_", "TSX_"))}
        stderr = open(workdir / "driver.stderr", "w")  # noqa: SIM115 - the process owns it until it exits
        process = subprocess.Popen(
            [str(toolchain.node), "--import", "tsx", "interop/driver.ts"],
            cwd=copy,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        stderr.close()
        return cls(process, workdir)

    def call(self, op: str, **arguments: Any) -> Any:
        """Run one operation in the harness and return its result.

        Raises:
            HarnessRefused: The harness threw (its error's name and message).
            RuntimeError: The driver died or did not answer.
        """
        self._next_id += 1
        request = {"id": self._next_id, "op": op, **_paths_as_text(arguments)}
        self._stdin.write(json.dumps(request) + "\n")
        self._stdin.flush()
        while True:
            line = self._readline()
            if not line.startswith(_ANSWER):
                self.log.append(line.rstrip("\n"))
                continue
            answer = json.loads(line[len(_ANSWER) :])
            if answer.get("id") != self._next_id:
                raise RuntimeError(f"the driver answered request {answer.get('id')}, not {self._next_id}")
            if answer["ok"]:
                return answer["result"]
            error = answer["error"]
            raise HarnessRefused(str(error["name"]), str(error["message"]), error.get("cause"))

    def _readline(self) -> str:
        if not self._selector.select(_ANSWER_TIMEOUT_S):
            raise RuntimeError(f"the harness driver did not answer within {_ANSWER_TIMEOUT_S} s{self._stderr()}")
        line = self._stdout.readline()
        if not line:
            raise RuntimeError(f"the harness driver exited ({self._process.poll()}){self._stderr()}")
        return line

    def _stderr(self) -> str:
        try:
            text = (self.workdir / "driver.stderr").read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"; its stderr: {text[-2000:]}" if text else ""

    def close(self) -> None:
        """Stop the driver (end of input), killing it if it does not exit."""
        self._selector.close()
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._stdout.close()


def _paths_as_text(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {key: _paths_as_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_paths_as_text(item) for item in value]
    return value
