"""Projections: pure folds over session logs, registered once and read live, from checkpoints or cold.

Layer: projection, above `dsh.session` (the cache below also uses `dsh.persistence`). The
`ProjectionRegistry` (`Services.projections`) is the single authority for every fold rule; units
follow the contract in `dsh.projection.unit`; `dsh.testing.check_unit` checks a unit against it
(needs the `pydsh[testing]` extra).
"""

from dsh.projection.errors import ProjectionError
from dsh.projection.registry import ChangeListener, Disposer, ProjectionRegistry
from dsh.projection.unit import (
    Checkpoint,
    CheckpointRow,
    ClientView,
    JsonObject,
    ProjectionSnapshot,
    ProjectionUnit,
    Restored,
    Schema,
    push_frame,
)

__all__ = [
    "ChangeListener",
    "Checkpoint",
    "CheckpointRow",
    "ClientView",
    "Disposer",
    "JsonObject",
    "ProjectionError",
    "ProjectionRegistry",
    "ProjectionSnapshot",
    "ProjectionUnit",
    "Restored",
    "Schema",
    "push_frame",
]
