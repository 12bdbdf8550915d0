"""How a Silver table is partitioned, as configured (`tables."<schema>.<table>".partition_by`); the column it
adds to the rows is app/sink/partitioning.py's."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal, cast

Granularity = Literal["value", "day", "month", "year"]
GRANULARITIES: Final = ("day", "month", "year")
_SPEC = re.compile(r"(?:(day|month|year)\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class PartitionSpec:
    """One partition level of a Silver table."""

    column: str  # the source column
    granularity: Granularity = "value"

    @property
    def field(self) -> str:
        """The column Hudi partitions by, and the partition's name in paths and in the catalog."""
        return self.column if self.granularity == "value" else f"{self.column}_{self.granularity}"

    def __str__(self) -> str:
        return self.column if self.granularity == "value" else f"{self.granularity}({self.column})"

    @classmethod
    def parse(cls, text: str) -> PartitionSpec:
        """`column`, `day(column)`, `month(column)` or `year(column)`.

        Raises:
            ValueError: anything else.
        """
        match = _SPEC.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"expected a column name or day(column), month(column), year(column); got {text!r}")
        granularity, derived_from, column = match.groups()
        if column is not None:
            return cls(column)
        return cls(derived_from, cast(Granularity, granularity))
