"""`ShellRunner`: runs one `bash -c` command, sandboxed by bubblewrap, and never leaves a process behind.

Layer: tools (private to `dsh.tools.workspace`). A command runs in its own process group (a new
session), with stdin closed, in a working folder inside the workspace, with an environment that
has no `DSH_*` and no `*_API_KEY` variables (plus `NO_COLOR`, `TERM=dumb`, `PAGER=cat`). Its
stdout and stderr are read at once into bounded buffers that keep the head and the tail. On its
timeout, or when the call's signal aborts, the whole process group gets SIGTERM and, after a grace,
SIGKILL; a cancelled call kills it at once; and when the command itself ends, whatever it left
running in its group is killed too (the tool has no background jobs).

The sandbox follows the session's mode (docs/tools.md#the-sandbox): `read-only` binds the whole file
system read-only; `workspace-write` adds the workspace read-write and a private `/tmp`;
`danger-full-access` runs without bubblewrap. Both confined modes get new PID and network namespaces
(no network unless `sandbox.network`). Where bubblewrap cannot run, `sandbox.when_unavailable`
decides: `refuse` (the call fails with `SANDBOX_UNAVAILABLE`) or `warn` (one WARNING, then commands
run unconfined).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from dsh.abort import AbortSignal
from dsh.agent.errors import ToolError

__all__ = ["SandboxSettings", "ShellResult", "ShellRunner", "StreamText", "scrubbed_environment"]

_log = logging.getLogger("dsh.tools.bash")

_TERMINAL_ENV: Final = {"NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat"}
_DENIAL_SIGNATURE: Final = "read-only file system"
_READ_CHUNK: Final = 65536


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """The sandbox knobs that are not per session: network access and what to do without bubblewrap."""

    network: bool = False
    when_unavailable: Literal["refuse", "warn"] = "refuse"
    bwrap: str | None = None
    """The bubblewrap binary; None looks `bwrap` up on `PATH`."""


@dataclass(frozen=True, slots=True)
class StreamText:
    """One output stream: its text (head and tail when it was too long) and how many bytes were left out."""

    text: str
    omitted_bytes: int

    def to_json(self) -> dict[str, object]:
        """`{text, truncated}`."""
        return {"text": self.text, "truncated": self.omitted_bytes > 0}


@dataclass(frozen=True, slots=True)
class ShellResult:
    """How one command ended."""

    exit_code: int | None
    signal: str | None
    timed_out: bool
    timeout_ms: int
    stdout: StreamText
    stderr: StreamText
    mode: str
    enforcement: Literal["bwrap", "none"]
    denied: bool


def scrubbed_environment() -> dict[str, str]:
    """The process environment without `DSH_*` and `*_API_KEY` variables, plus the terminal settings."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("DSH_") and not name.upper().endswith("_API_KEY")
    }
    return {**kept, **_TERMINAL_ENV}


class _Capture:
    """Keeps the first and the last bytes of a stream, counting what falls between."""

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.omitted = 0

    def feed(self, chunk: bytes) -> None:
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size > self._tail_limit:
            first = self._tail[0]
            extra = self._tail_size - self._tail_limit
            if len(first) <= extra:
                self._tail.popleft()
                self._tail_size -= len(first)
                self.omitted += len(first)
            else:
                self._tail[0] = first[extra:]
                self._tail_size -= extra
                self.omitted += extra

    def result(self) -> StreamText:
        head = bytes(self._head).decode(errors="replace")
        tail = b"".join(self._tail).decode(errors="replace")
        if self.omitted:
            return StreamText(f"{head}\n[... {self.omitted} bytes of output omitted ...]\n{tail}", self.omitted)
        return StreamText(head + tail, 0)


class ShellRunner:
    """Runs commands for one workspace, with one sandbox configuration."""

    def __init__(
        self,
        root: Path,
        settings: SandboxSettings | None = None,
        *,
        max_output_bytes: int = 64_000,
        grace_s: float = 2.0,
    ) -> None:
        self.root = root
        self.settings = settings or SandboxSettings()
        self.max_output_bytes = max_output_bytes
        self.grace_s = grace_s
        self._bwrap: str | bool | None = False  # False: not probed yet; None: not usable
        self._warned = False

    async def sandbox_available(self) -> bool:
        """Whether bubblewrap runs here (probed once, with the profile the tool uses)."""
        if self._bwrap is False:
            self._bwrap = await asyncio.to_thread(self._probe)
        return self._bwrap is not None

    def _probe(self) -> str | None:
        binary = self.settings.bwrap or shutil.which("bwrap")
        if binary is None:
            return None
        argv = [binary, *self._profile("read-only", Path("/")), "--", "true"]
        try:
            completed = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)  # noqa: S603 - a fixed argv
        except (OSError, subprocess.TimeoutExpired):
            return None
        if completed.returncode != 0:
            _log.info("bubblewrap cannot run here: %s", completed.stderr.decode(errors="replace").strip())
            return None
        return binary

    def _profile(self, mode: str, workdir: Path) -> list[str]:
        args = ["--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--proc", "/proc", "--die-with-parent"]
        if not self.settings.network:
            args.append("--unshare-net")
        if mode == "workspace-write":
            # The workspace is bound after the private /tmp, so a workspace below /tmp stays visible.
            args += ["--tmpfs", "/tmp", "--bind", str(self.root), str(self.root)]  # noqa: S108 - the sandbox's own /tmp
        args += ["--chdir", str(workdir)]
        return args

    async def argv(self, command: str, workdir: Path, mode: str) -> tuple[list[str], Literal["bwrap", "none"]]:
        """The argv to run and the enforcement it gets.

        Raises:
            ToolError: `SANDBOX_UNAVAILABLE` when a confined mode needs bubblewrap, it cannot run, and
                the settings refuse to run unconfined.
        """
        shell = ["bash", "-c", command]
        if mode == "danger-full-access":
            return shell, "none"
        if await self.sandbox_available():
            assert isinstance(self._bwrap, str)
            return [self._bwrap, *self._profile(mode, workdir), "--", *shell], "bwrap"
        if self.settings.when_unavailable == "warn":
            if not self._warned:
                self._warned = True
                _log.warning(
                    "bubblewrap cannot run here: bash commands run WITHOUT a sandbox (sandbox.when_unavailable = warn)"
                )
            return shell, "none"
        raise ToolError(
            f'bash: the sandbox mode "{mode}" needs bubblewrap, which cannot run here, so the command was not run. '
            'Install bubblewrap (Debian: apt-get install bubblewrap), or set sandbox.when_unavailable = "warn" '
            'to run unconfined, or sandbox = "off".',
            code="SANDBOX_UNAVAILABLE",
            name="bash",
        )

    async def run(
        self, command: str, *, workdir: Path, timeout_ms: int, mode: str, signal_: AbortSignal
    ) -> ShellResult:
        """Run `command`; returns when it and everything it started are gone.

        Raises:
            ToolError: `SANDBOX_UNAVAILABLE` (see `argv`).
            BaseException: The signal's abort reason when the call was interrupted (the processes are gone then).
        """
        argv, enforcement = await self.argv(command, workdir, mode)
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=workdir,
            env=scrubbed_environment(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        out, err = _Capture(self.max_output_bytes), _Capture(self.max_output_bytes)
        assert process.stdout is not None
        assert process.stderr is not None
        readers = [
            asyncio.ensure_future(_drain(process.stdout, out)),
            asyncio.ensure_future(_drain(process.stderr, err)),
        ]
        timed_out = False
        # `process.wait()` returns only once the pipes are closed too, and a child left running in
        # the background keeps them open: the exit is watched on the process itself.
        exited = asyncio.ensure_future(_exit_of(process))
        try:
            timed_out = await self._wait(process, exited, timeout_ms / 1000, signal_)
            # Output a leftover child still holds open must not keep the call waiting: give the pipes
            # the grace, then the group is killed (below) and they close.
            await asyncio.wait(readers, timeout=self.grace_s)
        except BaseException:
            _kill_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(BaseException):
                await asyncio.shield(_end_group(process.pid))
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(process.wait()), 10)
            raise
        finally:
            exited.cancel()
            await _end_group(process.pid)
            for reader in readers:
                if not reader.done():
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(reader, 5)
                    reader.cancel()
        signal_.throw_if_aborted()
        # Everything is gone and the pipes are closed: the exit status is there.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 10)
        code = process.returncode
        stdout, stderr = out.result(), err.result()
        if enforcement == "bwrap" and code not in (0, None) and stderr.text.startswith("bwrap: "):
            raise ToolError(
                f"bash: the sandbox could not start, so the command was not run: {stderr.text.strip()}",
                code="SANDBOX_UNAVAILABLE",
                name="bash",
            )
        killed = signal.Signals(-code).name if code is not None and code < 0 else None
        denied = enforcement == "bwrap" and code not in (0, None) and _DENIAL_SIGNATURE in stderr.text.lower()
        return ShellResult(
            exit_code=None if killed is not None else code,
            signal=killed,
            timed_out=timed_out,
            timeout_ms=timeout_ms,
            stdout=stdout,
            stderr=stderr,
            mode=mode,
            enforcement=enforcement,
            denied=denied,
        )

    async def _wait(
        self, process: asyncio.subprocess.Process, exited: asyncio.Future[None], timeout_s: float, signal_: AbortSignal
    ) -> bool:
        """Wait for the process to exit; on its timeout or an abort, stop its group. True when it timed out."""
        aborted: asyncio.Future[Any] = asyncio.ensure_future(signal_.wait())
        waiters: set[asyncio.Future[Any]] = {exited, aborted}
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if exited in done:
            return False
        await self._stop(process, exited)
        return aborted not in done

    async def _stop(self, process: asyncio.subprocess.Process, exited: asyncio.Future[None]) -> None:
        """SIGTERM to the group, then SIGKILL after the grace."""
        _kill_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), self.grace_s)
        if not exited.done():
            _kill_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(exited), 10)


async def _exit_of(process: asyncio.subprocess.Process) -> None:
    """Return when the process has exited (through a pidfd where there is one, else `process.wait()`)."""
    if not hasattr(os, "pidfd_open"):
        await process.wait()
        return
    try:
        fd = os.pidfd_open(process.pid)
    except OSError:
        return  # already exited and reaped
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _settle, exited)
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _drain(stream: asyncio.StreamReader, capture: _Capture) -> None:
    while True:
        chunk = await stream.read(_READ_CHUNK)
        if not chunk:
            return
        capture.feed(chunk)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _live_members(pgid: int) -> list[int]:
    """The pids of the group's processes that have not exited yet (Linux `/proc`; elsewhere none are known)."""
    members: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X", b"x"):
            members.append(int(name))
    return members


async def _end_group(pgid: int, guard_s: float = 10.0) -> None:
    """SIGKILL the whole group and wait until every member has exited.

    A killed process takes a moment to exit (a sandbox's PID namespace is torn down with it), so
    each member is watched through a pidfd, opened before the kill so a reused pid cannot be
    mistaken for it. Where pidfds are not available the group is only killed.
    """
    watched: list[int] = []
    if hasattr(os, "pidfd_open"):
        for pid in _live_members(pgid):
            with contextlib.suppress(OSError):
                watched.append(os.pidfd_open(pid))
    _kill_group(pgid, signal.SIGKILL)
    if not watched:
        return
    loop = asyncio.get_running_loop()
    exits: list[asyncio.Future[None]] = []
    try:
        for fd in watched:
            exited: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _settle, exited)
            exits.append(exited)
        await asyncio.wait(exits, timeout=guard_s)
    finally:
        for fd in watched:
            loop.remove_reader(fd)
            os.close(fd)


# The public names (docs/architecture.md#public-names).
SandboxSettings.__module__ = "dsh.tools.workspace"
ShellRunner.__module__ = "dsh.tools.workspace"
