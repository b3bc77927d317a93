"""The PostgreSQL storage backend, shared by several hosts, and the public part of its schema.

Layer: persistence. `PostgresBackend` keeps every session of a store in one PostgreSQL schema
(docs/storage-format.md#postgresql-schema), with one fenced writer lease per live session so hosts
never interleave events. Its modules are private: `_backend` (the backend, its pool, retries and the
driver-error boundary), `_driver` (lazy driver imports, URL masking), `_schema` (migrations and open
checks), `_leases` (leases and the heartbeat), `_reads` and `_writes` (the statements), `_notify` (the
notification channel, its listener and the request rows of `dsh serve` replicas).

Importing this package does not import the driver: `psycopg` (the `postgres` extra) loads when a
`PostgresBackend` is constructed. The names re-exported here are the documented surface for fixture
writers, the projection cache and tools:

* `SCHEMA_VERSION` and `TABLES`: the schema version this build reads and writes, and its tables;
* `INSERT_SESSION` and `INSERT_EVENT`: the row inserts, with `{s}` standing for the quoted schema;
* `migrate_store(driver, conn, schema, location)`: create or migrate a schema as a writing open does;
* `load_driver()`, `mask_url(url)`, `check_schema_name(name)`, `quoted(schema)`: driver and naming helpers;
* `LeaseRow`: one lease as `PostgresBackend.diagnostics()` lists it;
* `Listener`, `RequestRow`, `channel_name(schema)`: what `PostgresBackend.listen` returns, one
  `session_requests` row, and a store's notification channel (docs/server.md#replicas).
"""

from dsh.persistence.postgres._backend import PostgresBackend
from dsh.persistence.postgres._driver import SCHEMES, check_schema_name, load_driver, mask_url, quoted
from dsh.persistence.postgres._leases import LeaseRow
from dsh.persistence.postgres._notify import Listener, RequestRow, channel_name
from dsh.persistence.postgres._schema import SCHEMA_VERSION, TABLES, migrate_store
from dsh.persistence.postgres._writes import INSERT_EVENT, INSERT_SESSION

__all__ = [
    "INSERT_EVENT",
    "INSERT_SESSION",
    "LeaseRow",
    "Listener",
    "PostgresBackend",
    "RequestRow",
    "SCHEMA_VERSION",
    "SCHEMES",
    "TABLES",
    "channel_name",
    "check_schema_name",
    "load_driver",
    "mask_url",
    "migrate_store",
    "quoted",
]
