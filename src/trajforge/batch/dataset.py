"""Dataset rows -> samples with stable content keys.

A sample's key is a hash of its row's *content* (canonical JSON, so key order and whitespace do
not matter) plus its occurrence number, so a prompt that appears twice is two samples, and a
reordered or extended dataset maps each row back to the same key on resume. Bad rows either
stop the run with the line number, or (``skip_bad_rows``) become failed samples with a reason.
"""

from __future__ import annotations

import gc
import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson


class DatasetError(ValueError):
    """The dataset cannot be used; the message names the file and line and says what to do."""


@dataclass(slots=True)
class Sample:
    """One unit of work. ``index`` is the 0-based row position (the reference's prompt_index)."""

    key: str
    index: int
    prompt: str
    image: str | None = None
    cwd: str | None = None
    setup_files: dict[str, str] | None = None


@dataclass(slots=True, frozen=True)
class BadRow:
    """A row that cannot run; kept so it is recorded as a failed sample, never dropped."""

    key: str
    index: int
    reason: str
    raw: str


@dataclass(slots=True)
class LoadedDataset:
    samples: list[Sample]
    bad_rows: list[BadRow]
    total_rows: int


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=10).hexdigest()


def _check_row(row: object) -> tuple[str, str | None, str | None, dict[str, str] | None]:
    """(prompt, image, cwd, setup_files) of a row, or ValueError with what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("row has no non-empty string 'prompt'")
    image = row.get("image") or row.get("docker_image")
    cwd = row.get("cwd")
    for name, value in (("image", image), ("cwd", cwd)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"'{name}' must be a string")
    files = row.get("setup_files")
    if files is not None and (
        not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values())
    ):
        raise ValueError("'setup_files' must be an object of relative path -> text content")
    for path in files or {}:
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise ValueError(f"setup_files path {path!r} must be relative and stay inside the task directory")
    return prompt, image, cwd, files or None


def _parse(raw: bytes) -> object:
    try:
        return orjson.loads(raw)  # orjson also rejects invalid UTF-8
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise ValueError(f"not valid UTF-8 (byte {uexc.start} of the line)") from None
        raise ValueError(f"malformed JSON ({exc.msg})") from None


@contextmanager
def _bulk_allocation() -> Iterator[None]:
    """Pause the cyclic GC while a million long-lived objects are created (it would rescan them
    over and over: a third of the load time), then freeze them out of later collections."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.freeze()


def load_dataset(path: Path, *, skip_bad_rows: bool = False, max_samples: int | None = None) -> LoadedDataset:
    """Parse a JSONL dataset. ``max_samples`` counts rows (good or bad) from the top."""
    with _bulk_allocation():
        return _load(path, skip_bad_rows, max_samples)


def _load(path: Path, skip_bad_rows: bool, max_samples: int | None) -> LoadedDataset:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {path}: {exc.strerror or exc}") from exc
    samples: list[Sample] = []
    bad: list[BadRow] = []
    seen: Counter[str] = Counter()
    rows = 0
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if max_samples is not None and rows >= max_samples:
            break
        index = rows
        rows += 1
        try:
            row = _parse(raw)
            prompt = row.get("prompt") if type(row) is dict else None
            if type(prompt) is str and prompt.strip() and len(row) == 1:  # the common, fast case
                image = cwd = files = None
            else:
                prompt, image, cwd, files = _check_row(row)
        except ValueError as exc:
            reason = f"line {lineno}: {exc}"
            if not skip_bad_rows:
                raise DatasetError(
                    f"{path}: {reason}; fix the row or pass --skip-bad-rows to record it as failed"
                ) from None
            digest = "bad-" + _digest(raw)
            seen[digest] += 1
            bad.append(BadRow(f"{digest}-{seen[digest] - 1}", index, reason, raw.decode("utf-8", "replace")))
            continue
        digest = _digest(orjson.dumps(row, option=orjson.OPT_SORT_KEYS))
        seen[digest] += 1
        samples.append(Sample(f"{digest}-{seen[digest] - 1}", index, prompt, image, cwd, files))
    if rows == 0:
        raise DatasetError(f"{path}: the dataset is empty; expected one JSON object per line with a 'prompt'")
    return LoadedDataset(samples, bad, rows)
