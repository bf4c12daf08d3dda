"""Exports of a run directory into the formats trainers read (docs/formats.md has each trainer's config).

* ``messages`` (TRL): ``{"messages": [...], "tools": [...]}`` in OpenAI format, the run's own system
  prompt first when it had one, tool-call ``arguments`` as JSON *objects* (what Hugging Face chat
  templates expect: a string there is rendered double-encoded and trained on as such), reasoning
  under ``reasoning_content``. ``datasets`` >= 4.7 loads the varying argument keys as ``Json``
  values, exactly;
* ``sharegpt``: ``{"conversations": [...]}`` exactly as the reference writes it (canonical system
  turn listing the tools, ``human``/``gpt``/``tool``);
* ``llamafactory`` / ``axolotl``: the shapes those trainers' loaders read without losing a turn
  (:mod:`trajforge.trajectory.trainer_formats`);
* ``hermes``: the reference's exact line: full system prompt with the tool schemas on every
  line and ``tool_stats`` / ``tool_error_counts`` zero-padded over every known tool;
* ``parquet``: ``RUN_NAME.parquet``: ``messages`` and ``tools`` columns (typed ``Json`` for
  ``datasets``) next to the records' own fields; it carries its schema, so even zero rows load;
* ``dpo``: ``{"prompt", "chosen", "rejected"}`` pairs by reward inside a ``prompt_index`` group, or
  by completion status when nothing was graded (:mod:`trajforge.trajectory.pairs`); a
  ``.stats.json`` sidecar says which.

Run lines keep tool schemas once in ``run.json``; exports put them back where a format needs them.
The raw lines keep the exact call text (ShareGPT ``<tool_call>`` JSON, or the raw string when the
model's arguments were not JSON); only the exports turn arguments into objects.
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
from trajforge.trajectory.pairs import PairStats, choose_ground, pair_by_completion, pair_by_reward
from trajforge.trajectory.trainer_formats import to_axolotl, to_llamafactory

FORMATS: tuple[str, ...] = ("messages", "sharegpt", "llamafactory", "axolotl", "hermes", "parquet", "dpo")
OUTPUT_FILES: tuple[str, ...] = ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl")
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
            name, arguments = call.get("name", ""), call.get("arguments", {})
        except json.JSONDecodeError:
            name, arguments = "", body
        # objects, as chat templates expect; a string here is what the model wrote when it was not
        # JSON (kept as written: the line's ShareGPT text has it too)
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


def _system_text(line: dict[str, Any]) -> str | None:
    text = (line.get("metadata") or {}).get("system_prompt")
    return text if isinstance(text, str) and text else None


def _system(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's own system prompt, which the model was conditioned on (kept on the line)."""
    text = _system_text(line)
    return [{"role": "system", "content": text}] if text else []


def to_messages(line: dict[str, Any], run: RunInfo) -> dict[str, Any]:
    return {
        "messages": _system(line) + _chat(line),
        "tools": run.tools_for(line["toolsets_used"]),
    }


def _prompt_of(line: dict[str, Any]) -> str:
    return next((t["value"] for t in line["conversations"] if t["from"] == "human"), "")


def _answered(line: dict[str, Any]) -> bool:
    return any(m["role"] == "assistant" for m in _chat(line))


def _pair_row(chosen: dict[str, Any], rejected: dict[str, Any], run: RunInfo) -> dict[str, Any]:
    return {
        "prompt": [*_system(chosen), {"role": "user", "content": _prompt_of(chosen)}],
        "chosen": _chat(chosen)[1:],
        "rejected": _chat(rejected)[1:],
        "tools": run.tools_for(chosen["toolsets_used"]),
        "prompt_index": chosen.get("prompt_index"),
        "chosen_key": chosen.get("key"),
        "rejected_key": rejected.get("key"),
        "chosen_reward": chosen.get("reward"),
        "rejected_reward": rejected.get("reward"),
        "rejected_status": rejected.get("status"),
        "rejected_reason": rejected.get("reason"),
    }


def dpo_pairs(run: RunInfo, lines: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], PairStats]:
    """The DPO rows of ``lines`` and how they were paired (by reward, else by completion status).

    A line whose sample never got a model answer (failed before the first reply) can be neither
    chosen nor rejected; it is left out and counted in the notes."""
    answered = [line for line in lines if _answered(line)]
    if choose_ground(lines) == "reward":
        pairs, stats = pair_by_reward(answered)
    else:
        pairs, stats = pair_by_completion(answered, _prompt_of)
    stats.lines = len(lines)
    if len(answered) < len(lines):
        stats.notes.append(f"{len(lines) - len(answered)} line(s) without a model answer left out")
    return [_pair_row(dict(c), dict(r), run) for c, r in pairs], stats


@dataclass
class ExportReport:
    """What an export wrote: the file, its row count and, for ``dpo``, how pairs were chosen."""

    path: Path
    rows: int
    pairing: PairStats | None = None
    sidecar: Path | None = None


def default_output(run_dir: Path, fmt: str) -> Path:
    if fmt == "parquet":  # named after the run: several runs' files can sit in one folder
        return Path(run_dir) / "export" / f"{Path(run_dir).resolve().name}.parquet"
    return Path(run_dir) / "export" / f"{fmt}.jsonl"


def _check_include(include: Iterable[str]) -> list[str]:
    names = list(include)
    bad = [n for n in names if n not in OUTPUT_FILES]
    if bad or not names:
        raise ExportError(f"include takes {', '.join(OUTPUT_FILES)}; got {', '.join(names) or 'nothing'}")
    return names


def export(
    run_dir: Path, fmt: str, output: Path | None = None, *, include: Iterable[str] | None = None
) -> ExportReport:
    """Write the export. ``include`` picks which output files feed it, for every format; the
    default is ``trajectories.jsonl``, and all three files for ``dpo`` (rejected answers live in
    ``failed``/``filtered`` when pairing by completion)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    names = _check_include(
        include if include is not None else OUTPUT_FILES if fmt == "dpo" else OUTPUT_FILES[:1]
    )
    run = load_run(run_dir)
    output = Path(output) if output else default_output(run_dir, fmt)
    output.parent.mkdir(parents=True, exist_ok=True)
    lines = (line for name in names for line in read_lines(Path(run_dir) / name))
    if fmt == "parquet":
        from trajforge.batch.export_parquet import write_parquet

        return ExportReport(output, write_parquet(((line, to_messages(line, run)) for line in lines), output))
    pairing = None
    if fmt == "dpo":
        rows_list, pairing = dpo_pairs(run, list(lines))
        rows: Iterable[dict[str, Any]] = rows_list
    elif fmt == "messages":
        rows = (to_messages(line, run) for line in lines)
    elif fmt == "llamafactory":
        rows = (
            to_llamafactory(_chat(line), run.tools_for(line["toolsets_used"]), _system_text(line))
            for line in lines
        )
    elif fmt == "axolotl":
        rows = (
            to_axolotl(_chat(line), run.tools_for(line["toolsets_used"]), _system_text(line))
            for line in lines
        )
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
    sidecar = None
    if pairing is not None:
        sidecar = output.with_name(output.name.removesuffix(".jsonl") + ".stats.json")
        sidecar.write_bytes(orjson.dumps(pairing.as_dict(), option=orjson.OPT_INDENT_2))
    return ExportReport(output, count, pairing, sidecar)


def export_run(
    run_dir: Path, fmt: str, output: Path | None = None, *, include: Iterable[str] | None = None
) -> tuple[Path, int]:
    """:func:`export`, returning (path, rows)."""
    report = export(run_dir, fmt, output, include=include)
    return report.path, report.rows
