"""`JsonlLogWriter`: the JSONL fixture writer (a `StoredLogWriter`) and its special damage.

Layer: testing (shipped). It writes session logs straight into a JSONL root in the backend's layout
and encoding (docs/storage-format.md#jsonl-layout), bypassing every check of the backend, so a test
can build exactly the state it needs: arbitrary headers and records, foreign versions and types,
packed rows (hand-made, or packed per batch as the TypeScript harness does by default with
`pack_chunks=True`, see `dsh.testing.upstream_logs`), torn final frames (in the magic, in the last
block, inside the checksum), flipped bytes, garbage lines, fragments without a newline, files at the
wrong path, empty files, huge headers, the other encoding's artifacts in a root, and flat legacy
files. It never validates anything."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson
import zstandard

from dsh.persistence.jsonl import Compression, artifact_name, project_key
from dsh.session.ids import encode_segment
from dsh.testing.stored_logs import encode_record
from dsh.testing.upstream_logs import pack_chunk_runs

__all__ = ["JsonlLogWriter", "TearPoint"]

TearPoint = Literal["magic", "last-block", "checksum"]
"""Where `tear` cuts the final zstd frame: after 2 bytes of its magic, inside its last block, or
inside its 4-byte content checksum."""

_CHECKSUM_BYTES = 4
_BLOCK_HEADER_BYTES = 3


def _lines(records: Sequence[Mapping[str, Any]], *, pack_chunks: bool = False) -> bytes:
    """One compact line per record (integers beyond 64 bits are written as the text they are).

    With `pack_chunks`, the records are one flush batch and runs of chunk deltas are packed first.
    """
    stored = pack_chunk_runs(records) if pack_chunks else records
    return b"".join(encode_record(record) + b"\n" for record in stored)


def _ensure_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)


class JsonlLogWriter:
    """Writes raw JSONL session logs under `root` (the same root a `JsonlBackend` opens).

    Args:
        root: The store root.
        compression: The encoding written by default (`"zstd"` or `"none"`).
        zstd_level: The zstd level for frames.
    """

    def __init__(self, root: str | os.PathLike[str], *, compression: Compression = "zstd", zstd_level: int = 3) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.compression: Compression = compression
        self.zstd_level = zstd_level

    # ---------------------------------------------------------------- paths

    def path_for(
        self,
        session_id: str,
        *,
        cwd: str | None = None,
        project: str | None = None,
        compression: Compression | None = None,
    ) -> str:
        """The artifact path for `session_id` under the project of `cwd` (or the `project` dir name)."""
        directory = project if project is not None else project_key(cwd)
        return os.path.join(
            self.root, directory, encode_segment(session_id), artifact_name(compression or self.compression)
        )

    def find(self, session_id: str) -> list[str]:
        """Every stored artifact of `session_id` (any project directory, either encoding), sorted."""
        if not os.path.isdir(self.root):
            return []
        segment = encode_segment(session_id)
        found: list[str] = []
        for project in sorted(os.listdir(self.root)):
            directory = os.path.join(self.root, project, segment)
            for compression in ("zstd", "none"):
                candidate = os.path.join(directory, artifact_name(compression))
                if os.path.isfile(candidate):
                    found.append(candidate)
        return found

    def path_of(self, session_id: str) -> str:
        """The one stored artifact of `session_id` (raises `LookupError` if there is not exactly one)."""
        found = self.find(session_id)
        if len(found) != 1:
            raise LookupError(f"expected one artifact for {session_id!r}, found {found}")
        return found[0]

    # ---------------------------------------------------------------- encoding

    def frame(self, text: bytes, *, compression: Compression | None = None) -> bytes:
        """One physical batch: a checksummed zstd frame of `text`, or `text` itself in raw mode."""
        if (compression or self.compression) == "none":
            return text
        return zstandard.ZstdCompressor(level=self.zstd_level, write_checksum=True).compress(text)

    def encode(
        self,
        header: Mapping[str, Any],
        records: Sequence[Mapping[str, Any]],
        *,
        batches: Sequence[int] | None = None,
        compression: Compression | None = None,
        pack_chunks: bool = False,
    ) -> bytes:
        """The bytes of a whole log: header frame/line, then one frame per batch.

        Args:
            header: The stored header record, written verbatim.
            records: Event records, written verbatim (one per line).
            batches: Sizes of consecutive batches (frames); default: all records in one batch.
            compression: Overrides the writer's encoding.
            pack_chunks: Pack each batch's chunk-delta runs into rows, as the TypeScript harness
                does by default (`batches` still count events, before packing).
        """
        out = [self.frame(encode_record(header) + b"\n", compression=compression)]
        sizes = list(batches) if batches is not None else [len(records)]
        if sum(sizes) != len(records):
            raise ValueError("batches must add up to the number of records")
        index = 0
        for size in sizes:
            chunk = records[index : index + size]
            index += size
            if chunk:
                out.append(self.frame(_lines(chunk, pack_chunks=pack_chunks), compression=compression))
        return b"".join(out)

    # ---------------------------------------------------------------- StoredLogWriter

    async def write(
        self,
        session_id: str,
        header: Mapping[str, Any],
        records: Sequence[Mapping[str, Any]],
        *,
        batches: Sequence[int] | None = None,
        cwd: str | Literal["header"] | None = "header",
        project: str | None = None,
        compression: Compression | None = None,
        pack_chunks: bool = False,
    ) -> None:
        """Replace everything stored for `session_id` with exactly this header and these records.

        The path is derived from `session_id` and the header's cwd, unless `cwd` or `project`
        override it (a header that names another place); `path_of` finds it afterwards.
        `pack_chunks` packs each batch as the TypeScript harness does by default.
        """
        data = self.encode(header, records, batches=batches, compression=compression, pack_chunks=pack_chunks)
        if cwd == "header":
            header_cwd = header.get("cwd")
            cwd = header_cwd if isinstance(header_cwd, str) else None
        path = self.path_for(session_id, cwd=cwd, project=project, compression=compression)
        await asyncio.to_thread(self._replace, session_id, path, data)

    async def append(self, session_id: str, records: Sequence[Mapping[str, Any]], *, pack_chunks: bool = False) -> None:
        """Append `records` as one batch (one frame), as another writer would (packed with `pack_chunks`)."""
        path = self.path_of(session_id)
        compression: Compression = "zstd" if path.endswith(".zstd") else "none"
        await self.append_bytes(
            session_id, self.frame(_lines(records, pack_chunks=pack_chunks), compression=compression)
        )

    async def damage_events(self, session_id: str) -> None:
        """Make the event region corrupt while the header stays listable.

        Zstd: flip a bit of the first event frame's content checksum (a decoder error inside a
        complete frame); a header-only log first gets one event frame. Raw: insert an unparsable
        line after the header and make sure a later line holds a `turn/end`.
        """
        path = self.path_of(session_id)
        data = await asyncio.to_thread(_read, path)
        if path.endswith(".zstd"):
            spans = frame_spans(data)
            if len(spans) < 2:
                data += self.frame(b'{"type":"turn/start","seq":0,"time":0,"data":{"turn":0}}\n')
                spans = frame_spans(data)
            _, end = spans[1]
            damaged = bytearray(data)
            damaged[end - 1] ^= 0x01
            await asyncio.to_thread(_overwrite, path, bytes(damaged))
            return
        head_end = data.index(b"\n") + 1
        events = data[head_end:]
        count = events.count(b"\n")
        closer = orjson.dumps(
            {"type": "turn/end", "seq": count, "time": 0, "data": {"turn": 0, "reason": {"kind": "completed"}}}
        )
        damaged_raw = data[:head_end] + b"\x00 not json\n" + events + closer + b"\n"
        await asyncio.to_thread(_overwrite, path, damaged_raw)

    async def snapshot(self, session_id: str) -> bytes:
        """Every artifact of the id with its path, mode and bytes (to prove a read changed nothing)."""
        return await asyncio.to_thread(self._snapshot, session_id)

    def _snapshot(self, session_id: str) -> bytes:
        parts: list[bytes] = []
        for path in self.find(session_id):
            st = os.stat(path)
            parts.extend((path.encode(), oct(st.st_mode).encode(), _read(path)))
        return b"\x00".join(parts)

    # ---------------------------------------------------------------- special damage

    async def append_bytes(self, session_id: str, data: bytes) -> None:
        """Append raw bytes (a garbage line, a fragment without newline, a hand-made frame)."""
        await asyncio.to_thread(_append, self.path_of(session_id), data)

    async def append_frame(self, session_id: str, text: bytes) -> None:
        """Append one complete frame whose plaintext is exactly `text` (zstd logs; raw: the text)."""
        path = self.path_of(session_id)
        compression: Compression = "zstd" if path.endswith(".zstd") else "none"
        await self.append_bytes(session_id, self.frame(text, compression=compression))

    async def write_bytes(
        self,
        session_id: str,
        data: bytes,
        *,
        cwd: str | None = None,
        project: str | None = None,
        compression: Compression | None = None,
    ) -> str:
        """Store exactly `data` as the artifact of `session_id` (empty files, incomplete first frames)."""
        path = self.path_for(session_id, cwd=cwd, project=project, compression=compression)
        await asyncio.to_thread(self._replace, session_id, path, data)
        return path

    async def write_flat(
        self,
        session_id: str,
        header: Mapping[str, Any],
        records: Sequence[Mapping[str, Any]],
        *,
        cwd: str | None = None,
    ) -> str:
        """A flat legacy artifact `<project>/<encoded id>.jsonl[.zstd]` (refused by the backend)."""
        suffix = ".jsonl.zstd" if self.compression == "zstd" else ".jsonl"
        path = os.path.join(self.root, project_key(cwd), encode_segment(session_id) + suffix)
        data = self.encode(header, records)
        await asyncio.to_thread(_write_new, path, data)
        return path

    async def tear(self, session_id: str, at: TearPoint) -> int:
        """Cut the final zstd frame (see `TearPoint`); returns the new file size.

        Raises:
            ValueError: The log is raw or has no event frame, or the last block is too short.
        """
        path = self.path_of(session_id)
        if not path.endswith(".zstd"):
            raise ValueError("tear applies to zstd logs; truncate raw logs with truncate()")
        data = await asyncio.to_thread(_read, path)
        spans = frame_spans(data)
        if len(spans) < 2:
            raise ValueError("the log has no event frame to tear")
        start, end = spans[-1]
        if at == "magic":
            cut = start + 2
        elif at == "checksum":
            cut = end - 2
        else:
            block_start, block_end = last_block_span(data[start:end])
            if block_end - block_start < 2:
                raise ValueError("the last block is too short to tear inside")
            cut = start + (block_start + block_end) // 2
        await asyncio.to_thread(_truncate, path, cut)
        return cut

    async def truncate(self, session_id: str, size: int) -> None:
        """Truncate the artifact to `size` bytes."""
        await asyncio.to_thread(_truncate, self.path_of(session_id), size)

    async def flip_byte(self, session_id: str, *, frame: int = 1, offset: int | None = None) -> int:
        """Flip one byte of frame `frame` (0 = header frame) of a zstd log; returns its file offset.

        Args:
            session_id: The session.
            frame: The frame index.
            offset: Offset inside the frame; default the middle of its content (between the frame
                header and the checksum).
        """
        path = self.path_of(session_id)
        data = bytearray(await asyncio.to_thread(_read, path))
        start, end = frame_spans(bytes(data))[frame]
        if offset is None:
            first = start + zstandard.frame_header_size(bytes(data[start:end])) + _BLOCK_HEADER_BYTES
            offset = (first + end - _CHECKSUM_BYTES) // 2 - start
        position = start + offset
        data[position] ^= 0x20
        await asyncio.to_thread(_overwrite, path, bytes(data))
        return position

    # ---------------------------------------------------------------- file plumbing

    def _replace(self, session_id: str, path: str, data: bytes) -> None:
        for old in self.find(session_id):
            os.unlink(old)
        _write_new(path, data)

    def remove(self, session_id: str) -> None:
        """Delete every session directory of `session_id` (simulates a log deleted between reads)."""
        for path in self.find(session_id):
            shutil.rmtree(os.path.dirname(path))


def frame_spans(data: bytes) -> list[tuple[int, int]]:
    """`(start, end)` of each complete zstd frame (boundaries from `zstandard`); a torn rest is left out."""
    spans: list[tuple[int, int]] = []
    position = 0
    while position < len(data):
        decoder = zstandard.ZstdDecompressor().decompressobj()
        decoder.decompress(data[position:])
        if not decoder.eof:
            break
        end = len(data) - len(decoder.unused_data)
        spans.append((position, end))
        position = end
    return spans


def last_block_span(frame: bytes) -> tuple[int, int]:
    """`(start, end)` of the content of the last block of one complete, checksummed frame.

    Test support only (it picks a tear point); the readers never locate frames this way.
    """
    position = zstandard.frame_header_size(frame)
    while True:
        raw = int.from_bytes(frame[position : position + _BLOCK_HEADER_BYTES], "little")
        last = raw & 1
        block_type = (raw >> 1) & 3
        size = raw >> 3
        content = 1 if block_type == 1 else size  # an RLE block stores one byte
        start = position + _BLOCK_HEADER_BYTES
        if last:
            return start, start + content
        position = start + content


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _write_fd(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _write_new(path: str, data: bytes) -> None:
    _ensure_dir(os.path.dirname(path))
    _write_fd(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), data)


def _overwrite(path: str, data: bytes) -> None:
    _write_fd(os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC), data)


def _append(path: str, data: bytes) -> None:
    _write_fd(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC), data)


def _truncate(path: str, size: int) -> None:
    os.truncate(path, size)


# Shown under the name users import (docs/architecture.md#public-names).
JsonlLogWriter.__module__ = "dsh.testing"
