"""The JSONL storage backend (the default) and the public part of its on-disk codec.

Layer: persistence. `JsonlBackend` stores one append-only file per session, zstd frames or plain
lines (docs/storage-format.md#jsonl-layout). Its modules are private: `_backend` (the backend),
`_files` (blocking file primitives: stable reads, revisions, durable writes), `_format` (the
pure codec: layout, encoding, the header record), `_scan` (the scan of the event region: parsed
records, fast verdicts and the torn-tail rule), `_open_logs` (the write descriptors kept open between
batches) and `_packed` (the packed chunk rows the TypeScript harness writes, checked and expanded on
read). The names re-exported here are
the documented surface for fixture writers, benchmarks and tools that lay out or encode logs
exactly as the backend does:

* `Compression` (`"zstd"` or `"none"`) and `Opener` (the read hook `JsonlBackend` accepts);
* `artifact_name(compression)`, `project_key(cwd)` and `relative_path(id, cwd, compression)`:
  where a session's log lives under the root;
* `encode_header(record)` and `encode_batch(records)`: the plaintext of the header record and of
  one batch (one line per record), before zstd framing;
* `FILE_READS` (a `FileReads`): how many files every `JsonlBackend` of the process opened for
  reading, by purpose (`head`, `log`, `revision`, `index`), counted where the backend opens them, so
  a test or a benchmark can prove what a listing costs.

The parent index (`_index`, `_listing`) is private: docs/storage-format.md#parent-index describes
its file format.
"""

from dsh.persistence.jsonl._backend import JsonlBackend
from dsh.persistence.jsonl._files import FILE_READS, FileReads, Opener
from dsh.persistence.jsonl._format import (
    Compression,
    artifact_name,
    encode_batch,
    encode_header,
    project_key,
    relative_path,
)

__all__ = [
    "Compression",
    "FILE_READS",
    "FileReads",
    "JsonlBackend",
    "Opener",
    "artifact_name",
    "encode_batch",
    "encode_header",
    "project_key",
    "relative_path",
]
