"""Exports of a run directory into the formats trainers read.

* ``messages``: TRL-ready SFT rows ``{"messages": [...], "tools": [...]}`` (OpenAI format, the run's
  own system prompt first when it had one, tool
  call arguments as JSON strings so every row has one Arrow schema, reasoning under
  ``reasoning_content``);
* ``sharegpt``: ``{"conversations": [...]}`` with the canonical system turn listing the tools;
* ``hermes``: the reference's exact line: full system prompt with the tool schemas on every
  line and ``tool_stats`` / ``tool_error_counts`` zero-padded over every known tool;
* ``parquet``: the run's records as a Parquet file;
* ``dpo``: ``{"prompt", "chosen", "rejected"}`` pairs (conversational) from a completed sample and
  a failed, partial or filtered sample of the same prompt.

Run lines keep tool schemas once in ``run.json``; exports put them back where a format needs them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trajforge.tools.toolsets import TOOLSETS
from trajforge.trajectory import system_prompt

FORMATS: tuple[str, ...] = ("messages", "sharegpt", "hermes", "parquet", "dpo")
_HERMES_FIELDS = (
    "prompt_index",
    "conversations",
    "metadata",
    "completed",
    "partial",
    "api_calls",
    "toolsets_used",
    "tool_stats",
    "tool_error_counts",
)
_THINK = re.compile(r"^<think>\n?(.*?)\n?</think>\n?", re.DOTALL)
_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


class ExportError(ValueError):
    """The run directory cannot be exported; the message says why."""


@dataclass
class RunInfo:
    run_dir: Path
    tools: list[dict[str, Any]]

    def tools_for(self, toolsets: Iterable[str]) -> list[dict[str, Any]]:
        """The schemas offered to a sample that had ``toolsets``, in run order."""
        names = {name for ts in toolsets for name in TOOLSETS.get(ts, ())}
        return [t for t in self.tools if t["function"]["name"] in names]


def load_run(run_dir: Path) -> RunInfo:
    run_file = Path(run_dir) / "run.json"
    try:
        info = orjson.loads(run_file.read_bytes())
    except FileNotFoundError:
        raise ExportError(f"{run_dir} is not a trajforge batch run (no run.json)") from None
    except orjson.JSONDecodeError as exc:
        raise ExportError(f"{run_file} is damaged: {exc}") from None
    return RunInfo(Path(run_dir), info.get("tools", []))


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with open(path, "rb") as fh:
        for raw in fh:
            if raw.strip():
                yield orjson.loads(raw)


# -- ShareGPT -> OpenAI messages ----------------------------------------------------------------
def _assistant(value: str, turn: int) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant"}
    reasoning = None
    m = _THINK.match(value)
    if m:
        reasoning = m.group(1).strip() or None
        value = value[m.end() :]
    calls = []
    for k, body in enumerate(_CALL.findall(value)):
        try:
            call = json.loads(body)
            name, args = call.get("name", ""), call.get("arguments", {})
        except json.JSONDecodeError:
            name, args = "", body
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(
            {"id": f"call_{turn}_{k}", "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    first = value.find("<tool_call>")
    content = (value if first < 0 else value[:first]).strip()
    msg["content"] = content
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tool_messages(value: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for k, body in enumerate(_RESPONSE.findall(value)):
        try:
            resp = json.loads(body)
        except json.JSONDecodeError:
            resp = {"content": body}
        content = resp.get("content", "")
        call_id = calls[k]["id"] if k < len(calls) else resp.get("tool_call_id") or f"call_x_{k}"
        out.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": resp.get("name", ""),
                "content": content if isinstance(content, str) else json.dumps(content, ensure_ascii=False),
            }
        )
    return out


def sharegpt_to_messages(conversations: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Our ShareGPT turns back to OpenAI messages (the inverse of the reference conversion)."""
    messages: list[dict[str, Any]] = []
    last_calls: list[dict[str, Any]] = []
    for turn, item in enumerate(conversations):
        role, value = item["from"], item["value"]
        if role == "system":
            continue
        if role == "human":
            messages.append({"role": "user", "content": value})
        elif role == "gpt":
            msg = _assistant(value, turn)
            last_calls = msg.get("tool_calls", [])
            messages.append(msg)
        elif role == "tool":
            messages.extend(_tool_messages(value, last_calls))
    return messages


# -- formats ------------------------------------------------------------------------------------
def _with_system(line: dict[str, Any], run: RunInfo) -> list[dict[str, str]]:
    """The conversation with its canonical tools system turn (older lines were saved without)."""
    conversations = line["conversations"]
    if conversations and conversations[0]["from"] == "system":
        return list(conversations)
    system = {"from": "system", "value": system_prompt(run.tools_for(line["toolsets_used"]))}
    return [system, *conversations]


def _chat(line: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI messages without the canonical system turn: trainers render ``tools`` themselves."""
    return [m for m in sharegpt_to_messages(line["conversations"]) if m["role"] != "system"]


def _all_known_tools(run: RunInfo) -> list[str]:
    names = [name for tools in TOOLSETS.values() for name in tools]
    return names + [t["function"]["name"] for t in run.tools if t["function"]["name"] not in names]


def to_hermes(line: dict[str, Any], run: RunInfo, known: list[str]) -> dict[str, Any]:
    out = {k: line[k] for k in _HERMES_FIELDS}
    out["conversations"] = _with_system(line, run)
    out["metadata"] = {k: line["metadata"][k] for k in ("batch_num", "timestamp", "model")}
    zero = {"count": 0, "success": 0, "failure": 0}
    out["tool_stats"] = {n: line["tool_stats"].get(n, zero) for n in known}
    out["tool_error_counts"] = {n: line["tool_error_counts"].get(n, 0) for n in known}
    return out


def _system(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's own system prompt, which the model was conditioned on (kept on the line)."""
    text = (line.get("metadata") or {}).get("system_prompt")
    return [{"role": "system", "content": text}] if text else []


def to_messages(line: dict[str, Any], run: RunInfo) -> dict[str, Any]:
    return {
        "messages": _system(line) + _chat(line),
        "tools": run.tools_for(line["toolsets_used"]),
    }


def dpo_pairs(run: RunInfo) -> Iterator[dict[str, Any]]:
    """One pair per prompt that has both a completed and a rejected sample."""
    chosen: dict[str, dict[str, Any]] = {}
    for line in read_lines(run.run_dir / "trajectories.jsonl"):
        chosen.setdefault(_prompt_of(line), line)
    used: set[str] = set()
    for name in ("filtered.jsonl", "failed.jsonl"):
        for line in read_lines(run.run_dir / name):
            prompt = _prompt_of(line)
            good = chosen.get(prompt)
            if good is None or prompt in used:
                continue
            rejected = _chat(line)[1:]
            if not rejected:
                continue  # failed before the model answered: nothing to reject
            used.add(prompt)
            yield {
                "prompt": [*_system(good), {"role": "user", "content": prompt}],
                "chosen": _chat(good)[1:],
                "rejected": rejected,
                "tools": run.tools_for(good["toolsets_used"]),
                "rejected_status": line["status"],
                "rejected_reason": line["reason"],
            }


def _prompt_of(line: dict[str, Any]) -> str:
    return next((t["value"] for t in line["conversations"] if t["from"] == "human"), "")


def export_run(
    run_dir: Path, fmt: str, output: Path | None = None, *, include: Iterable[str] = ("trajectories.jsonl",)
) -> tuple[Path, int]:
    """Write the export; returns (path, rows). ``include`` picks which output files feed it
    (all formats but dpo)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    run = load_run(run_dir)
    suffix = "parquet" if fmt == "parquet" else "jsonl"
    output = Path(output) if output else Path(run_dir) / "export" / f"{fmt}.{suffix}"
    output.parent.mkdir(parents=True, exist_ok=True)
    lines = (line for name in include for line in read_lines(Path(run_dir) / name))
    if fmt == "parquet":
        return output, _write_parquet(list(lines), output)
    if fmt == "dpo":
        rows: Iterable[dict[str, Any]] = dpo_pairs(run)
    elif fmt == "messages":
        rows = (to_messages(line, run) for line in lines)
    elif fmt == "sharegpt":
        rows = ({"conversations": _with_system(line, run)} for line in lines)
    else:
        known = _all_known_tools(run)
        rows = (to_hermes(line, run, known) for line in lines)
    count = 0
    tmp = output.with_name(f".{output.name}.tmp")
    with open(tmp, "wb", buffering=1 << 20) as fh:  # streamed: a run can be larger than memory
        for row in rows:
            fh.write(orjson.dumps(row) + b"\n")
            count += 1
    tmp.replace(output)
    return output, count


def _write_parquet(lines: list[dict[str, Any]], output: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(lines) if lines else pa.table({})
    tmp = output.with_name(f".{output.name}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(output)
    return len(lines)
