"""The embedded SQLite storage backend and the public part of its schema.

Layer: persistence. `SqliteBackend` keeps every session of a store in one database file
(docs/storage-format.md#sqlite-schema). Its modules are private: `_backend` (the backend, its
connection threads and the driver-error boundary) and `_schema` (schema, pragmas, open checks,
queries and row codecs). The names re-exported here are the documented surface for fixture writers
and tools that write rows exactly as the backend does; all of them block, so run them off the
event loop:

* `APPLICATION_ID` and `USER_VERSION`: the pragmas that mark a database as this store;
* `open_store(path, busy_timeout_ms=...)`: a configured writing connection to a checked store,
  initialised when pristine (what the backend's `open` does);
* `INSERT_SESSION`, `INSERT_EVENT` and `header_columns(header)`: the statements and the column
  values of a `sessions` row's header facts.
"""

from dsh.persistence.sqlite._backend import SqliteBackend
from dsh.persistence.sqlite._schema import (
    APPLICATION_ID,
    INSERT_EVENT,
    INSERT_SESSION,
    USER_VERSION,
    header_columns,
    open_store,
)

__all__ = [
    "APPLICATION_ID",
    "INSERT_EVENT",
    "INSERT_SESSION",
    "SqliteBackend",
    "USER_VERSION",
    "header_columns",
    "open_store",
]
