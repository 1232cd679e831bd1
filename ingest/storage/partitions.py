"""Reconcile partitions: the programs split into `parts` sets that replicas of a shared database
reconcile apart (`TALLY_RECONCILE_PARTITIONS`, api/jobs.py).

Every reconcile rule is per program (reconcile/run/job.py), so the books of a set of programs are
the books of the whole log restricted to those programs. A program's partition is a hash of its
id, computed alike here and in PostgreSQL (`Scope.programs_sql`): the first 32 bits of the MD5
of the id, modulo `parts`. A program made later falls in a partition like any other, without a
list to keep.

Partition 0 also owns what belongs to no program: the unroutable processor events
(`rc_unroutable`). Those leave the list when a backfill copies them into a program, whichever
partition that program is in, so partition 0's working copy holds the processor events a
backfill copied as well (`Scope.rows_sql`); the rows reconciled from them belong to another partition and
are never published by partition 0 (`Scope.keep`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

Rows = TypeVar("Rows", pa.Table, pa.RecordBatch)


def part_of(program_id: str, parts: int) -> int:
    """The partition of `program_id` among `parts`."""
    return int(hashlib.md5(program_id.encode(), usedforsecurity=False).hexdigest()[:8], 16) % parts


@dataclass(frozen=True)
class Scope:
    """Partition `part` of `parts` (parts > 1)."""

    part: int
    parts: int

    def __post_init__(self) -> None:
        if not 0 <= self.part < self.parts or self.parts < 2:
            raise ValueError(f"no partition {self.part} of {self.parts}")

    @property
    def label(self) -> str:
        return f"{self.part + 1}/{self.parts}"

    def owns(self, program_id: str) -> bool:
        return part_of(program_id, self.parts) == self.part

    def programs_sql(self, column: str = "program_id") -> str:
        """PostgreSQL: `column` (a program id, not null) is of this partition."""
        return f"mod(('x' || substr(md5({column}), 1, 8))::bit(32)::bigint, {self.parts}) = {self.part}"

    def rows_sql(self) -> str:
        """PostgreSQL, over `raw_events`: the rows this partition's working copy holds (its
        programs' rows; for partition 0 also the unroutable rows and the processor events a
        backfill copied into any program: the unroutable list reads them, see the module)."""
        mine = f"(program_id IS NOT NULL AND {self.programs_sql()})"
        if self.part:
            return mine
        return f"({mine} OR program_id IS NULL OR (kind = 'stripe' AND source = 'backfill'))"

    def keep(self, rows: Rows) -> Rows:
        """The rows of a published table (with `program_id`; a table or one batch of it) that
        belong to this partition."""
        ids = pc.unique(rows.column("program_id")).drop_null().to_pylist()
        mine = pa.array([i for i in ids if self.owns(i)], pa.string())
        if len(mine) == len(ids):
            return rows
        return rows.filter(pc.is_in(rows.column("program_id"), value_set=mine))


def scopes(parts: int) -> list[Scope | None]:
    """The partitions of a store reconciled in `parts` (1: one scope, the whole log)."""
    return [None] if parts <= 1 else [Scope(part, parts) for part in range(parts)]
