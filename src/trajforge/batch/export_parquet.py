"""The Parquet export: one typed table a trainer and a notebook can both load as it is.

Written through ``datasets`` so the file carries the Hugging Face feature types in its schema:
``messages`` and ``tools`` are lists of ``Json`` values (tool-call arguments and tool parameter
schemas differ from call to call; as Arrow structs they would become unions padded with nulls,
which a chat template then renders), the record's own fields keep their plain types, and a run
with zero rows still has its columns (``load_dataset("parquet", ..., streaming=True)`` or
``Dataset(pyarrow.parquet.read_table(path))`` read it; map-style ``load_dataset`` refuses any
zero-row split in datasets 5.x, whatever the format).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

# scalar fields of a run line, with their datasets type names
_SCALARS: tuple[tuple[str, str], ...] = (
    ("key", "string"),
    ("prompt_index", "int64"),
    ("status", "string"),
    ("reason", "string"),
    ("completed", "bool"),
    ("partial", "bool"),
    ("reward", "float64"),
    ("reward_reason", "string"),
    ("api_calls", "int64"),
    ("termination", "string"),
)
_JSON_FIELDS = ("reward_breakdown", "metadata", "usage", "timings", "tool_stats", "tool_error_counts")


def features() -> Any:
    """The export's column types (``datasets.Features``)."""
    from datasets import Features, Json, List, Value

    spec: dict[str, Any] = {"messages": List(Json()), "tools": List(Json())}
    spec.update({name: Value(kind) for name, kind in _SCALARS})
    spec["toolsets_used"] = List(Value("string"))
    spec["conversations"] = List({"from": Value("string"), "value": Value("string")})
    spec.update({name: Json() for name in _JSON_FIELDS})
    return Features(spec)


def write_parquet(rows: Iterable[tuple[dict[str, Any], dict[str, Any]]], output: Path) -> int:
    """Write (run line, its messages export row) pairs to ``output`` atomically; returns the row count."""
    from datasets import Dataset

    feats = features()
    columns: dict[str, list[Any]] = {name: [] for name in feats}
    count = 0
    for line, chat in rows:
        columns["messages"].append(chat["messages"])
        columns["tools"].append(chat["tools"])
        for name in feats:
            if name not in ("messages", "tools"):
                columns[name].append(line.get(name))
        count += 1
    table = Dataset.from_dict(columns, features=feats)
    tmp = output.with_name(f".{output.name}.tmp")
    table.to_parquet(str(tmp))
    tmp.replace(output)
    return count
