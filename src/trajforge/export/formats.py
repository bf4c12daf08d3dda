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
* ``dpo``: ``{"prompt", "chosen", "rejected", "tools"}`` pairs by reward inside a ``prompt_index``
  group, or by completion status when nothing was graded (:mod:`trajforge.trajectory.pairs`); a
  ``.stats.json`` sidecar says which.

The messages, llamafactory and axolotl rows also carry the sample's ``key``, ``prompt_index``,
``status`` and ``reward``, so a dataset can be filtered again after the export.

What goes in (:class:`ExportOptions`): the output files read, a :class:`Selection` (status,
minimum reward, best N per prompt, answers grounded in their tool outputs: rejection sampling),
and what to do with a sample that holds a malformed tool call. Every sample read is either
written or counted under the reason it was left out (``ExportReport.left_out``); nothing is
dropped silently.

**Calls are never invented.** The lines keep conversations as ShareGPT text, where a call that
ran and call markup the model wrote as text look alike; :func:`trajforge.trajectory.calls.to_messages`
tells them apart by the structure the agent loop leaves. A sample with a malformed call is left out
of every SFT format by default (``malformed_calls="skip"``): training on it teaches the model to
write broken calls, whatever shape it is given. ``malformed_calls="text"`` keeps it with the
malformed call as the assistant's text, exactly as the model wrote it, and the loop's parse-error
reply after it. In ``dpo`` a sample with a malformed call may always be the *rejected* answer
(rendered as text: that is what DPO should push down) and is chosen only with ``"text"``.

**No empty JSONL.** ``datasets`` cannot load a zero-row JSONL file, so an export that would write
one raises :class:`EmptyExportError` (the CLI exits non-zero) and writes nothing; Parquet carries its
schema and is written even empty (docs/formats.md says how to load it).

Run lines keep tool schemas once in ``run.json``; exports put them back where a format needs them.

Every line is read as the one record (:mod:`trajforge.record`; older lines upgraded), so an
``env eval`` run (``episodes.jsonl``, every status in one file) exports like a batch run: its
ShareGPT turns are rendered from the episode's messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trajforge.llm.parsers.markup import find_call_markup
from trajforge.record import Record, RecordError, Reward
from trajforge.record import load as load_record
from trajforge.record.runs import kind_problem
from trajforge.record.views import reference_view
from trajforge.tools.toolsets import TOOLSETS
from trajforge.trajectory import system_prompt
from trajforge.trajectory.calls import Conversation, MarkupCheck, to_messages
from trajforge.trajectory.grounding import check_answer
from trajforge.trajectory.pairs import (
    PairStats,
    choose_ground,
    pair_by_completion,
    pair_by_reward,
    reward_of,
)
from trajforge.trajectory.selection import Selection, best_per_prompt
from trajforge.trajectory.trainer_formats import llamafactory_problem, to_axolotl, to_llamafactory

FORMATS: tuple[str, ...] = ("messages", "sharegpt", "llamafactory", "axolotl", "hermes", "parquet", "dpo")
OUTPUT_FILES: tuple[str, ...] = ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl")
ENV_FILE = "episodes.jsonl"  # an env run's records (engine.books.EPISODES_FILE)
MalformedPolicy = Literal["skip", "text"]
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


class ExportError(ValueError):
    """The run directory cannot be exported; the message says why."""


class EmptyExportError(ExportError):
    """Nothing would be written: the message says what was read and why each sample was left out."""


class ExportOptions(BaseModel):
    """What an export reads and keeps (the format and the output path are the call's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    include: tuple[str, ...] | None = Field(
        None,
        description="output files to read (default: trajectories.jsonl; dpo: all three; with a "
        "status selection, the files that hold those statuses)",
    )
    select: Selection = Field(default_factory=Selection)
    malformed_calls: MalformedPolicy = Field(
        "skip",
        description="skip: leave out samples with a malformed tool call (counted); text: keep them, "
        "the malformed call as the assistant's text",
    )

    @field_validator("include")
    @classmethod
    def _known_files(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if names is None:
            return None
        bad = [n for n in names if n not in OUTPUT_FILES]
        if bad or not names:
            raise ValueError(f"include takes {', '.join(OUTPUT_FILES)}; got {', '.join(names) or 'nothing'}")
        return names

    def files(self, fmt: str) -> list[str]:
        if self.include is not None:
            return list(self.include)
        if fmt == "dpo":  # rejected answers live in failed/filtered when pairing by completion
            return list(OUTPUT_FILES)
        return self.select.files() or [OUTPUT_FILES[0]]


@dataclass
class RunInfo:
    run_dir: Path
    tools: list[dict[str, Any]]
    env_run: bool = False
    """An ``env eval`` run: its records are all in ``episodes.jsonl`` (every status)."""

    def tools_for(self, toolsets: Iterable[str]) -> list[dict[str, Any]]:
        """The schemas offered to a sample that had ``toolsets``, in run order."""
        names = {name for ts in toolsets for name in TOOLSETS.get(ts, ())}
        return [t for t in self.tools if t["function"]["name"] in names]


def load_run(run_dir: Path) -> RunInfo:
    run_file = Path(run_dir) / "run.json"
    problem = kind_problem(Path(run_dir), ("batch", "env eval"), "export reads the samples of")
    if problem is not None:
        raise ExportError(problem)
    try:
        info = orjson.loads(run_file.read_bytes())
    except FileNotFoundError:
        raise ExportError(f"{run_dir} is a run without its run.json: it cannot be exported") from None
    except orjson.JSONDecodeError as exc:
        raise ExportError(f"{run_file} is damaged: {exc}") from None
    env_run = (Path(run_dir) / ENV_FILE).exists() and not any(
        (Path(run_dir) / name).exists() for name in OUTPUT_FILES
    )
    return RunInfo(Path(run_dir), info.get("tools", []), env_run)


def read_lines(
    path: Path, run: RunInfo, tell: Callable[[int, int], None] | None = None
) -> Iterator[dict[str, Any]]:
    """Each line of ``path`` read as the one record (an older line upgraded), as the flat view the
    formats below are written from: the record's fields and its reference view (the ShareGPT
    turns a batch line stored, or rendered from the messages of an env episode). ``tell(offset,
    n)``: the bytes read so far and the line number, for a progress display."""
    if not path.exists():
        return
    with open(path, "rb") as fh:
        offset = 0
        for n, raw in enumerate(fh, 1):
            offset += len(raw)
            if tell is not None:
                tell(offset, n)
            if raw.strip():
                try:
                    record = load_record(orjson.loads(raw))
                except (orjson.JSONDecodeError, RecordError) as exc:
                    raise ExportError(f"{path}:{n}: {exc}") from None
                yield export_view(record, run)


def export_view(record: Record, run: RunInfo) -> dict[str, Any]:
    """The record as one flat dict: its fields, the reference view, and the reward as the flat
    columns every export has always had (:func:`reward_columns`)."""
    tools = run.tools_for(record.toolsets)
    view = {**record.model_dump(mode="json"), **reference_view(record, tools)}
    view.update(reward_columns(record.reward))
    view["graded_by"] = record.env if record.reward_value is not None or record.env else None
    return view


def reward_columns(reward: Reward | None) -> dict[str, Any]:
    """The record's one :class:`~trajforge.record.Reward` as the flat columns of the exports, the
    one place it is flattened: ``reward`` a number or null (what ``--min-reward``, DPO pairs and
    ``ds.filter(lambda r: r["reward"] == 1)`` read), ``reward_reason``, ``reward_error`` and
    ``reward_breakdown`` (its components; null when not judged). A trainer-facing row wants a
    scalar it can filter and sort on, not an object; what the judge kept and its token
    advantages stay in the run files (``rl train --records`` reads those)."""
    judged = reward is not None and reward.value is not None
    return {
        "reward": reward.value if reward is not None else None,
        "reward_reason": reward.reason if reward is not None else "",
        "reward_error": reward.error if reward is not None else None,
        "reward_breakdown": dict(reward.components) if reward is not None and judged else None,
    }


# -- one sample ---------------------------------------------------------------------------------
def markup_check(tools: list[dict[str, Any]] | None) -> MarkupCheck:
    """The agent loop's markup check for a sample offered ``tools``: a turn's text (calls to those
    tools written as text included) and its reasoning (tags)."""

    def markup(text: str | None, reasoning: str | None) -> str | None:
        return find_call_markup(text, tools=tools) or find_call_markup(reasoning)

    return markup


@dataclass
class Sample:
    """A run line and its conversation as OpenAI messages (calls told apart from text)."""

    line: dict[str, Any]
    chat: Conversation

    @classmethod
    def of(cls, line: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> Sample:
        """``tools``: the schemas the sample was offered (a call to one of them written as text
        in an answer is markup, as the agent loop counts it)."""
        termination = line.get("termination")
        ended = None if termination is None else termination == "final_answer"
        chat = to_messages(line.get("conversations") or [], ended_on_answer=ended, markup=markup_check(tools))
        return cls(line, chat)

    @property
    def answered(self) -> bool:
        return any(m["role"] == "assistant" for m in self.chat.messages)

    @property
    def empty_answer(self) -> bool:
        """The conversation ends on an assistant message with neither text nor a call: a sample
        that trains a model to say nothing (and whose turns Axolotl finds nothing to train in)."""
        last = self.chat.messages[-1] if self.chat.messages else None
        return bool(
            last is not None
            and last["role"] == "assistant"
            and not str(last.get("content") or "").strip()
            and not last.get("tool_calls")
        )

    @property
    def malformed_kinds(self) -> list[str]:
        return sorted({m.kind for m in self.chat.malformed})

    def grounded(self) -> bool | None:
        """Whether the final answer is grounded in the sample's tool outputs (None: no answer)."""
        result = check_answer(self.chat.messages)
        return None if result is None else result.grounded

    def extras(self) -> dict[str, Any]:
        """What rows carry beside the conversation, to filter on after the export."""
        line = self.line
        return {
            "key": line.get("key"),
            "prompt_index": line.get("prompt_index"),
            "status": line.get("status"),
            "reward": reward_of(line),
        }


def _malformed_reason(sample: Sample) -> str:
    return f"malformed tool call ({', '.join(sample.malformed_kinds)})"


def _ungrounded_reason(grounded: bool | None) -> str:
    return "no final answer (--grounded)" if grounded is None else "answer not grounded in its tool outputs"


def left_out_reason(sample: Sample, options: ExportOptions) -> str | None:
    """Why ``sample`` is not exported to an SFT format (None: it is)."""
    why = options.select.left_out_reason(sample.line)
    if why is not None:
        return why
    if not sample.answered:
        return "no model answer"
    if sample.empty_answer:
        return "empty final answer"
    if sample.chat.malformed and options.malformed_calls == "skip":
        return _malformed_reason(sample)
    if options.select.grounded:
        grounded = sample.grounded()
        if not grounded:
            return _ungrounded_reason(grounded)
    return None


# -- formats ------------------------------------------------------------------------------------
def _with_system(line: dict[str, Any], run: RunInfo) -> list[dict[str, str]]:
    """The conversation with its canonical tools system turn (older lines were saved without)."""
    conversations = line["conversations"]
    if conversations and conversations[0]["from"] == "system":
        return list(conversations)
    system = {"from": "system", "value": system_prompt(run.tools_for(line["toolsets_used"]))}
    return [system, *conversations]


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


def to_messages_row(sample: Sample, run: RunInfo) -> dict[str, Any]:
    line = sample.line
    return {
        "messages": _system(line) + sample.chat.messages,
        "tools": run.tools_for(line["toolsets_used"]),
        **sample.extras(),
    }


def _row(
    fmt: str, sample: Sample, run: RunInfo, known: list[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """(the row, None) or (None, why this format cannot hold the sample)."""
    line = sample.line
    if fmt == "messages":
        return to_messages_row(sample, run), None
    if fmt == "llamafactory":
        row = to_llamafactory(sample.chat.messages, run.tools_for(line["toolsets_used"]), _system_text(line))
        problem = llamafactory_problem(row)
        if problem is not None:
            return None, f"llamafactory cannot read it: {problem}"
        return {**row, **sample.extras()}, None
    if fmt == "axolotl":
        row = to_axolotl(sample.chat.messages, run.tools_for(line["toolsets_used"]), _system_text(line))
        return {**row, **sample.extras()}, None
    if fmt == "sharegpt":
        return {"conversations": _with_system(line, run)}, None
    return to_hermes(line, run, known), None


# -- DPO ----------------------------------------------------------------------------------------
def _prompt_of(line: Mapping[str, Any]) -> str:
    return next((t["value"] for t in line["conversations"] if t["from"] == "human"), "")


NOT_A_MODEL_FORK = "the two answers part at a tool result, not at a model turn"


def fork(chosen: list[dict[str, Any]], rejected: list[dict[str, Any]]) -> int | None:
    """Where two conversations of one prompt part: the index of the first message that differs,
    when it is an assistant turn in both (None: they part elsewhere, or one holds the other)."""
    n = 0
    while n < len(chosen) and n < len(rejected) and chosen[n] == rejected[n]:
        n += 1
    if n >= len(chosen) or n >= len(rejected):
        return None
    if chosen[n]["role"] != "assistant" or rejected[n]["role"] != "assistant":
        return None
    return n


def _pair_row(chosen: Sample, rejected: Sample, run: RunInfo) -> dict[str, Any] | None:
    """One DPO row of agent trajectories: the prompt is all the two share (the system prompt, the
    user's turn, and the turns both took alike, tool results included), the completions are the
    one assistant turn where each went its own way. A completion is only ever the model's tokens:
    DPO scores every completion token as the policy's choice, and a tool result or the loop's
    "could not be parsed" turn is not (docs/formats.md, ``dpo``). None: the two part at a tool
    result (the same call answered differently), where no model turn is to prefer."""
    c, r = chosen.line, rejected.line
    at = fork(chosen.chat.messages, rejected.chat.messages)
    if at is None:
        return None
    return {
        "prompt": [*_system(c), *chosen.chat.messages[:at]],
        "chosen": [chosen.chat.messages[at]],
        "rejected": [rejected.chat.messages[at]],
        "tools": run.tools_for(c["toolsets_used"]),
        "prompt_index": c.get("prompt_index"),
        "chosen_key": c.get("key"),
        "rejected_key": r.get("key"),
        "chosen_reward": c.get("reward"),
        "rejected_reward": r.get("reward"),
        "rejected_status": r.get("status"),
        "rejected_reason": r.get("reason"),
        "shared_turns": at,
    }


def dpo_pairs(
    run: RunInfo, lines: list[dict[str, Any]], options: ExportOptions | None = None
) -> tuple[list[dict[str, Any]], PairStats]:
    """The DPO rows of ``lines`` and how they were paired (by reward, else by completion status).

    The selection says what a *chosen* answer must be (status, reward, no malformed call unless
    ``malformed_calls="text"``, grounded with ``--grounded``, which also breaks ties of reward in
    favour of the grounded answer); any answered sample may be rejected. A line whose sample never
    got a model answer (failed before the first reply) can be neither; it is left out and counted."""
    options = options or ExportOptions()
    samples = [Sample.of(line, run.tools_for(line["toolsets_used"])) for line in lines]
    answered = [s for s in samples if s.answered]
    by_id = {id(s.line): s for s in answered}
    grounded: dict[int, bool | None] = {}

    def grounding(line: Mapping[str, Any]) -> bool | None:
        if id(line) not in grounded:
            grounded[id(line)] = by_id[id(line)].grounded()
        return grounded[id(line)]

    def can_choose(line: Mapping[str, Any]) -> str | None:
        why = options.select.left_out_reason(line)
        if why is not None:
            return why
        sample = by_id[id(line)]
        if sample.empty_answer:
            return "empty final answer"
        if sample.chat.malformed and options.malformed_calls == "skip":
            return _malformed_reason(sample)
        if options.select.grounded and not grounding(line):
            return _ungrounded_reason(grounding(line))
        return None

    def tiebreak(line: Mapping[str, Any]) -> int:
        return 1 if grounding(line) else 0

    chosen_lines = [s.line for s in answered]
    if choose_ground(lines) == "reward":
        pairs, stats = pair_by_reward(
            chosen_lines,
            can_choose=can_choose,
            tiebreak=tiebreak if options.select.grounded else None,
            max_per_prompt=options.select.max_per_prompt,
        )
    else:
        pairs, stats = pair_by_completion(chosen_lines, _prompt_of, can_choose=can_choose)
    stats.lines = len(lines)
    if len(answered) < len(lines):
        stats.notes.append(f"{len(lines) - len(answered)} line(s) without a model answer left out")
    rows = []
    for c, r in pairs:
        row = _pair_row(by_id[id(c)], by_id[id(r)], run)
        if row is None:
            stats.pairs -= 1
            stats.pairs_left_out[NOT_A_MODEL_FORK] = stats.pairs_left_out.get(NOT_A_MODEL_FORK, 0) + 1
            continue
        rows.append(row)
    return rows, stats


# -- the export ---------------------------------------------------------------------------------
@dataclass
class ExportReport:
    """What an export wrote: the file, its row count, what it read and what it left out (by reason)
    and, for ``dpo``, how pairs were chosen."""

    path: Path
    rows: int
    read: int = 0
    left_out: dict[str, int] = field(default_factory=dict)
    pairing: PairStats | None = None
    sidecar: Path | None = None


def default_output(run_dir: Path, fmt: str) -> Path:
    if fmt == "parquet":  # named after the run: several runs' files can sit in one folder
        return Path(run_dir) / "export" / f"{Path(run_dir).resolve().name}.parquet"
    return Path(run_dir) / "export" / f"{fmt}.jsonl"


Progress = Callable[[str, int, int], None]
"""(phase, KiB read, KiB in all): an export's progress, for a live display."""


class _Kept:
    """The samples of the run that the options keep, streamed (twice with --max-per-prompt:
    once to choose the best per prompt, once to write), with every left-out one counted."""

    def __init__(
        self, run: RunInfo, names: list[str], options: ExportOptions, progress: Progress | None = None
    ) -> None:
        self.run = run
        self.paths = [run.run_dir / name for name in names]
        self.options = options
        self.progress = progress
        self.total_kib = sum(p.stat().st_size for p in self.paths if p.exists()) // 1024
        self.read = 0
        self.left_out: Counter[str] = Counter()
        self.allowed: set[str] | None = None
        limit = options.select.max_per_prompt
        if limit is not None:
            candidates = (
                (s.line.get("prompt_index"), reward_of(s.line), str(s.line.get("key")))
                for s in self._eligible(count=False)
            )
            self.allowed = best_per_prompt(candidates, limit)

    def _lines(self, report: bool) -> Iterator[dict[str, Any]]:
        """Every line of the files as the record's view, telling ``progress`` (KiB read of the
        total) as it goes."""
        if not report or self.progress is None:
            for path in self.paths:
                yield from read_lines(path, self.run)
            return
        progress, done = self.progress, 0
        for path in self.paths:
            if not path.exists():
                continue

            def tell(offset: int, n: int, base: int = done) -> None:
                if n % 256 == 0:
                    progress("exporting", (base + offset) // 1024, self.total_kib)

            yield from read_lines(path, self.run, tell)
            done += path.stat().st_size
        progress("exporting", self.total_kib, self.total_kib)

    def _eligible(self, *, count: bool) -> Iterator[Sample]:
        for line in self._lines(report=count):
            sample = Sample.of(line, self.run.tools_for(line["toolsets_used"]))
            why = left_out_reason(sample, self.options)
            if count:
                self.read += 1
                if why is not None:
                    self.left_out[why] += 1
            if why is None:
                yield sample

    def __iter__(self) -> Iterator[Sample]:
        for sample in self._eligible(count=True):
            if self.allowed is not None and str(sample.line.get("key")) not in self.allowed:
                self.left_out["over --max-per-prompt"] += 1
                continue
            yield sample


def _describe(read: int, left_out: Mapping[str, int]) -> str:
    if not left_out:
        return f"{read} sample(s) read"
    parts = ", ".join(f"{n} {why}" for why, n in sorted(left_out.items(), key=lambda kv: -kv[1]))
    return f"{read} sample(s) read, left out: {parts}"


def _empty(fmt: str, output: Path, what: str, hint: str) -> EmptyExportError:
    return EmptyExportError(
        f"nothing to export as {fmt}: {what}; {output} was not written (datasets cannot load a "
        f"zero-row JSONL file). {hint}"
    )


def export(
    run_dir: Path,
    fmt: str,
    output: Path | None = None,
    *,
    include: Iterable[str] | None = None,
    options: ExportOptions | None = None,
    progress: Progress | None = None,
) -> ExportReport:
    """Write the export (module docstring). ``include`` is the shorthand for ``options.include``."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    options = options or ExportOptions()
    if include is not None:
        try:
            options = ExportOptions(**{**options.model_dump(), "include": tuple(include)})
        except ValidationError as exc:
            raise ExportError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
    run = load_run(run_dir)
    output = Path(output) if output else default_output(run_dir, fmt)
    names = [ENV_FILE] if run.env_run else options.files(fmt)
    if fmt == "dpo":
        return _export_dpo(run, names, output, options)
    kept = _Kept(run, names, options, progress)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        from trajforge.export.parquet import write_parquet

        rows = write_parquet(((s.line, to_messages_row(s, run), s.malformed_kinds) for s in kept), output)
        return ExportReport(output, rows, kept.read, dict(kept.left_out))
    known = _all_known_tools(run)
    count = 0
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        with open(tmp, "wb", buffering=1 << 20) as fh:  # streamed: a run can be larger than memory
            for sample in kept:
                row, problem = _row(fmt, sample, run, known)
                if row is None:
                    kept.left_out[problem or fmt] += 1
                    continue
                fh.write(orjson.dumps(row) + b"\n")
                count += 1
        if count == 0:
            raise _empty(
                fmt,
                output,
                f"{_describe(kept.read, kept.left_out)} from {', '.join(names)}",
                "Loosen the selection, include other files (--include), or use --format parquet, "
                "which carries its schema even with zero rows.",
            )
        tmp.replace(output)
    finally:
        tmp.unlink(missing_ok=True)
    return ExportReport(output, count, kept.read, dict(kept.left_out))


def _export_dpo(run: RunInfo, names: list[str], output: Path, options: ExportOptions) -> ExportReport:
    lines = [line for name in names for line in read_lines(run.run_dir / name, run)]
    rows, pairing = dpo_pairs(run, lines, options)
    output.parent.mkdir(parents=True, exist_ok=True)
    sidecar = output.with_name(output.name.removesuffix(".jsonl") + ".stats.json")
    sidecar.write_bytes(orjson.dumps(pairing.as_dict(), option=orjson.OPT_INDENT_2))
    if not rows:
        p = pairing
        left = "".join(f", {n} {why}" for why, n in p.pairs_left_out.items())
        raise _empty(
            "dpo",
            output,
            f"0 pairs by {p.ground} from {p.lines} lines in {p.groups} groups ({p.tied_pairs_skipped} "
            f"tied pairs skipped, {p.ungraded_lines} ungraded lines{left}); details in {sidecar}",
            "A pair needs two answers to one prompt that differ in reward (batch --group-size N "
            "with --env), or a completed and a failed one when nothing was graded.",
        )
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    tmp.replace(output)
    return ExportReport(output, len(rows), len(lines), {}, pairing, sidecar)


def export_run(
    run_dir: Path, fmt: str, output: Path | None = None, *, include: Iterable[str] | None = None
) -> tuple[Path, int]:
    """:func:`export`, returning (path, rows)."""
    report = export(run_dir, fmt, output, include=include)
    return report.path, report.rows
