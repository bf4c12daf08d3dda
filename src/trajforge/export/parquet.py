"""The Parquet export: one typed table a trainer and a notebook can both load as it is.

Built as a ``datasets`` table so the file carries the Hugging Face feature types in its schema:
``messages`` and ``tools`` are lists of ``Json`` values (tool-call arguments and tool parameter
schemas differ from call to call; as Arrow structs they would become unions padded with nulls,
which a chat template then renders), the record's own fields keep their plain types, and a run
with zero rows still has its columns (``load_dataset("parquet", ..., streaming=True)`` or
``Dataset(pyarrow.parquet.read_table(path))`` read it; map-style ``load_dataset`` refuses any
zero-row split in datasets 5.x, whatever the format). ``malformed_calls`` names the kinds of
malformed tool call a row holds (empty unless the export kept them as text).

The reference's ShareGPT turns travel as ``sharegpt``, never as ``conversations``: a column of that
name is a conversation to every trainer that reads one. TRL's ``maybe_convert_to_chatml`` renames
``conversations`` to ``messages`` over the real messages (every row trained on the reference's
text with ``human``/``gpt`` roles no template knows), and LLaMA-Factory and Axolotl look for it
by default. ``messages`` is the only conversation in the file (tests/test_export_consumers_agree.py).

The table is written with pyarrow itself, not ``Dataset.to_parquet``, which draws a progress bar
on the terminal of whoever runs ``trajforge export``; the file is the same (the features travel in
the schema's ``huggingface`` metadata either way).
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
    spec["sharegpt"] = List({"from": Value("string"), "value": Value("string")})
    spec["malformed_calls"] = List(Value("string"))
    spec.update({name: Json() for name in _JSON_FIELDS})
    return Features(spec)


def write_parquet(rows: Iterable[tuple[dict[str, Any], dict[str, Any], list[str]]], output: Path) -> int:
    """Write (run line, its messages export row, its malformed-call kinds) triples to ``output``
    atomically; returns the row count."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    feats = features()
    columns: dict[str, list[Any]] = {name: [] for name in feats}
    count = 0
    for line, chat, malformed in rows:
        columns["messages"].append(chat["messages"])
        columns["tools"].append(chat["tools"])
        columns["malformed_calls"].append(malformed)
        columns["sharegpt"].append(line.get("conversations"))
        for name in feats:
            if name not in ("messages", "tools", "malformed_calls", "sharegpt"):
                columns[name].append(line.get(name))
        count += 1
    table = Dataset.from_dict(columns, features=feats).data.table
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        # no row group at all for zero rows: readers size their batches by the first row group
        with pq.ParquetWriter(str(tmp), table.schema) as writer:
            if table.num_rows:
                writer.write_table(table)
        tmp.replace(output)
    finally:
        tmp.unlink(missing_ok=True)
    return count
