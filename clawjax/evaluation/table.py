"""A small table record rendered as Markdown (for READMEs and terminals) and CSV (for spreadsheets)."""

from __future__ import annotations

import csv
import dataclasses
import io

Cell = str | int | float | None


def _escape(text: str) -> str:
  return text.replace("|", "\\|")  # a pipe inside a cell would end it


@dataclasses.dataclass
class Table:
  columns: list[str]
  rows: list[list[Cell]]
  decimals: int = 2  # floats are printed with this many decimals (the paper's two)

  def __post_init__(self):
    for i, row in enumerate(self.rows):
      if len(row) != len(self.columns):
        raise ValueError(f"Table row {i} has {len(row)} cells for {len(self.columns)} columns")

  def _cell(self, v: Cell, empty: str) -> str:
    if v is None:
      return empty
    if isinstance(v, float):
      return f"{v:.{self.decimals}f}"
    return str(v)

  def markdown(self) -> str:
    lines = ["| " + " | ".join(map(_escape, self.columns)) + " |",
             "|" + "|".join("---" for _ in self.columns) + "|"]
    lines += ["| " + " | ".join(_escape(self._cell(v, "-")) for v in row) + " |"
              for row in self.rows]
    return "\n".join(lines) + "\n"

  def csv(self) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(self.columns)
    writer.writerows([self._cell(v, "") for v in row] for row in self.rows)
    return buf.getvalue()
