"""Dataset rows -> samples with stable content keys.

A sample's key is a hash of its row's *content* (canonical JSON, so key order and whitespace do
not matter) plus its occurrence number, so a prompt that appears twice is two samples, and a
reordered or extended dataset maps each row back to the same key on resume. Bad rows either
stop the run with the line number, or (``skip_bad_rows``) become failed samples with a reason.

A resume of a million-row run must not parse a million rows again: :func:`index_dataset`
keeps only each row's key and byte offset (a :class:`DatasetIndex`) and builds a
:class:`Sample` just for the rows that will run, and the index can be saved in the run
directory (:func:`save_index`). A saved index is used only for the bytes it was built from: it
stores a hash of the dataset prefix it covers (whole lines only) and is checked against the
file on every load, so an edited, reordered or truncated file is re-parsed, an appended file
re-parses only its new tail, and a corrupt or foreign index file is ignored.

Rows are data, and the process that runs them is often root: a row's ``cwd`` resolves only under
the data root (``--data-root``, default: the dataset file's own directory) and becomes a
``ROOT/./REL`` path that the sandbox's copy-in walks from the root without following links; a
``cwd`` outside it, and a setup file name the sandbox cannot hold (NUL, a component over 255 bytes,
``..``, absolute, no file named), make the row a bad row with its line number, before anything
runs (never an infrastructure failure that is retried). The saved index records the root it was
built under: another root re-parses.
"""

from __future__ import annotations

import gc
import hashlib
import os
import sys
import zlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trajforge.record.keys import content_digest
from trajforge.sandbox.confined import DataPathError, beneath, name_problem

if TYPE_CHECKING:
    from _hashlib import HASH

INDEX_FILE = "dataset.index"
_INDEX_MAGIC = b"trajforge-dataset-index\n"
# Bump whenever a row's key, the row rules or the file layout change: older files are ignored.
_INDEX_VERSION: Final = 2


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
    extra: dict[str, Any] | None = None  # the row's other fields (ids, expected answers, ...), kept
    sample_index: int = 0  # which of the row's --group-size samples (key ends in #k)


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


_ROW_FIELDS = frozenset({"prompt", "image", "docker_image", "cwd", "setup_files"})


def _check_row(row: object, root: str) -> tuple[str, str | None, str | None, dict[str, str] | None]:
    """(prompt, image, cwd, setup_files) of a row, or ValueError with what is wrong. ``cwd`` comes
    back as ``ROOT/./REL`` under the data root ``root`` (see :func:`beneath`)."""
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
    if cwd is not None:
        try:
            cwd = beneath(root, cwd, "cwd").marked()
        except DataPathError as exc:
            raise ValueError(
                f"{exc}: a row's cwd must name a directory under the data root (--data-root, default: "
                "the dataset's own directory)"
            ) from None
    files = row.get("setup_files")
    if files is not None and (
        not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values())
    ):
        raise ValueError("'setup_files' must be an object of relative path -> text content")
    for path in files or {}:
        problem = name_problem(path)
        if problem:
            shown = repr(path) if len(path) <= 80 else f"{path[:60]!r}... ({len(path)} characters)"
            raise ValueError(f"setup_files name {shown} {problem}")
    return prompt, image, cwd, files  # {} kept: the record gives back the row as it was


def _parse(raw: bytes) -> object:
    try:
        return orjson.loads(raw)  # orjson also rejects invalid UTF-8
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise ValueError(f"not valid UTF-8 (byte {uexc.start} of the line)") from None
        raise ValueError(f"malformed JSON ({exc.msg})") from None


def _key_base(raw: bytes, root: str) -> str:
    """A row's key without its occurrence number; ValueError for a bad row."""
    row = _parse(raw)
    if not _prompt_only(row):
        _check_row(row, root)  # the common one-field row needs no further checks
    return content_digest(row)  # the one keying rule (record.keys), which env eval shares


def _prompt_only(row: object) -> bool:
    """The common row: ``{"prompt": "<text that is not blank>"}`` and nothing else."""
    if type(row) is not dict or len(row) != 1:
        return False
    prompt = row.get("prompt")
    return type(prompt) is str and bool(prompt.strip())


def _bad_base(raw: bytes) -> str:
    return "bad-" + _digest(raw)


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


_SHOWN_BAD_ROWS = 10


def _bad_row_error(path: Path, reason: str) -> DatasetError:
    return DatasetError(f"{path}: {reason}; fix the row or pass --skip-bad-rows to record it as failed")


def _bad_rows_error(path: Path, reasons: list[str]) -> DatasetError:
    """Every bad row of the file at once (the first ten, and how many more), not just the first."""
    if len(reasons) == 1:
        return _bad_row_error(path, reasons[0])
    shown = "; ".join(reasons[:_SHOWN_BAD_ROWS])
    more = f"; and {len(reasons) - _SHOWN_BAD_ROWS} more" if len(reasons) > _SHOWN_BAD_ROWS else ""
    return DatasetError(
        f"{path}: {len(reasons)} bad rows: {shown}{more}; fix them or pass --skip-bad-rows to record "
        "them as failed"
    )


@dataclass(eq=False)
class DatasetIndex:
    """Every row's key and where its line starts; a row becomes a :class:`Sample` (or
    :class:`BadRow`) only when asked for, so a resume builds objects just for the rows to run."""

    path: Path
    data: bytes
    keys: list[str]
    offsets: array[int]
    bad: dict[int, str]
    """row index -> reason ("line N: ...") of each bad row (only with ``skip_bad_rows``)"""
    root: str = ""
    """the data root (absolute; a link in it is the operator's) a row's ``cwd`` must lie under"""
    cached_rows: int = 0
    """leading rows whose keys came from a saved index (0: every row was parsed)"""
    covered: int = 0
    """bytes of whole lines spanned by the rows (what a saved index can vouch for)"""
    covered_rows: int = 0
    covered_lines: int = 0
    _saved: _Saved | None = field(default=None, repr=False)
    """the saved index the first ``cached_rows`` rows came from (None if cut by max_samples)"""
    _prompts: list[str | None] = field(default_factory=list, repr=False)
    """prompts of plain ``{"prompt": ...}`` rows parsed in this process, from row
    ``cached_rows`` on (None: another kind of row), so running them needs no second parse"""

    @property
    def total_rows(self) -> int:
        return len(self.keys)

    def line(self, index: int) -> bytes:
        start = self.offsets[index]
        end = self.data.find(b"\n", start)
        return self.data[start : end if end >= 0 else len(self.data)]

    def sample(self, index: int) -> Sample:
        parsed = index - self.cached_rows
        if 0 <= parsed < len(self._prompts) and (prompt := self._prompts[parsed]) is not None:
            return Sample(self.keys[index], index, prompt)
        row = _parse(self.line(index))
        prompt, image, cwd, files = _check_row(row, self.root)
        assert isinstance(row, dict)  # _check_row said so
        extra = {k: v for k, v in row.items() if k not in _ROW_FIELDS}
        return Sample(self.keys[index], index, prompt, image, cwd, files, extra or None)

    def samples(self, indexes: list[int]) -> tuple[list[Sample], list[BadRow]]:
        """The rows at ``indexes``: samples, and bad rows, each in the order given."""
        with _bulk_allocation():
            bad = self.bad
            return [self.sample(i) for i in indexes if i not in bad], [
                self.bad_row(i) for i in indexes if i in bad
            ]

    def forget_parsed(self) -> None:
        """Drop the prompts kept from parsing (once the samples to run are built)."""
        self._prompts = []

    def bad_row(self, index: int) -> BadRow:
        raw = self.line(index)
        return BadRow(self.keys[index], index, self.bad[index], raw.decode("utf-8", "replace"))

    def fingerprint(self, rows: int) -> str:
        """A hash of the first ``rows`` keys in order: equal fingerprints, equal row -> key maps."""
        saved = self._saved
        if saved is None or not 0 < self.cached_rows <= rows:
            return hashlib.blake2b(self._keys_blob(rows), digest_size=20).hexdigest()
        if saved.fingerprint is None:
            saved.fingerprint = hashlib.blake2b(saved.keys_blob, digest_size=20)
        h = saved.fingerprint.copy()  # the saved keys are hashed once, however often asked
        if rows > self.cached_rows:
            h.update(("\n" + "\n".join(self.keys[self.cached_rows : rows])).encode("ascii"))
        return h.hexdigest()

    def _keys_blob(self, rows: int) -> bytes:
        """The first ``rows`` keys, "\n"-joined (a saved index holds this for its rows)."""
        saved = self._saved
        if saved is None or not 0 < self.cached_rows <= rows:
            return "\n".join(self.keys[:rows]).encode("ascii")
        if rows == self.cached_rows:
            return saved.keys_blob
        return saved.keys_blob + ("\n" + "\n".join(self.keys[self.cached_rows : rows])).encode("ascii")

    def to_loaded(self) -> LoadedDataset:
        return LoadedDataset(*self.samples(list(range(self.total_rows))), self.total_rows)


# -- the saved index ------------------------------------------------------------------------------
class _IndexHeader(BaseModel):
    """What a saved index vouches for: ``rows`` rows spanning ``covered`` bytes (``lines``
    newlines) of a dataset whose prefix has the SHA-256 ``content``; ``payload`` is the CRC-32
    of the rest (the keys, "\n"-joined, then the row offsets), against a torn or damaged file."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: Literal[2]
    byteorder: str
    covered: int = Field(ge=0)
    lines: int = Field(ge=0)
    rows: int = Field(ge=0)
    keys_bytes: int = Field(ge=0)
    root: str
    content: str
    payload: int
    bad: list[tuple[int, str]]


@dataclass(slots=True)
class _Saved:
    header: _IndexHeader
    keys_blob: bytes
    keys: list[str]
    offsets: array[int]
    content: HASH
    """the SHA-256 state after the covered bytes: a longer prefix hashes only what it adds"""
    fingerprint: hashlib.blake2b | None = None
    """the BLAKE2b state after ``keys_blob``, once a fingerprint was asked for"""


def _read_index(cache: Path, data: bytes, root: str) -> _Saved | None:
    """The saved index for ``data`` under the data root ``root``, or None when there is none or
    it cannot be trusted."""
    try:
        blob = cache.read_bytes()
    except OSError:
        return None
    try:
        return _decode_index(blob, data, root)
    except (ValueError, TypeError, IndexError, ValidationError):
        return None  # corrupt, foreign, stale or from another version: parse instead


def _decode_index(blob: bytes, data: bytes, root: str) -> _Saved | None:
    view = memoryview(blob)
    start = len(_INDEX_MAGIC)
    if view[:start] != _INDEX_MAGIC:
        return None
    head_len = int.from_bytes(view[start : start + 4], "little")
    header = _IndexHeader.model_validate_json(bytes(view[start + 4 : start + 4 + head_len]))
    payload = view[start + 4 + head_len :]
    rows = header.rows
    if (
        header.version != _INDEX_VERSION
        or header.byteorder != sys.byteorder
        or header.root != root  # which rows are bad depends on it
        or header.covered > len(data)
        or len(payload) != header.keys_bytes + 8 * rows
        or zlib.crc32(payload) != header.payload
    ):
        return None
    content = hashlib.sha256(memoryview(data)[: header.covered])
    if content.hexdigest() != header.content:
        return None
    keys_blob = bytes(payload[: header.keys_bytes])
    keys = keys_blob.decode("ascii").split("\n") if rows else []
    offsets = array("q")
    offsets.frombytes(payload[header.keys_bytes :])
    bad = dict(header.bad)
    if len(keys) != rows or len(offsets) != rows or len(bad) != len(header.bad):
        return None
    if not all(0 <= i < rows and keys[i].startswith("bad-") for i in bad):
        return None
    saved = _Saved(header, keys_blob, keys, offsets, content)
    # The hashes prove these are the bytes the index was built from; a few rows re-derived
    # from the file also guard against an index written by a faulty build.
    rederived = all(
        _row_agrees(saved, data, i, i in bad, root) for i in ({0, rows // 2, rows - 1} if rows else ())
    )
    return saved if rederived else None


def _row_agrees(saved: _Saved, data: bytes, i: int, bad: bool, root: str) -> bool:
    """Row ``i`` of the file starts at its saved offset and has its saved key."""
    off, covered = saved.offsets[i], saved.header.covered
    if not (0 <= off < covered and (off == 0 or data[off - 1] == 0x0A)):
        return False
    end = data.find(b"\n", off)
    if not off <= end < covered:
        return False
    raw = data[off:end]
    try:
        base = _bad_base(raw) if bad else _key_base(raw, root)
    except ValueError:
        return False
    return saved.keys[i].rpartition("-")[0] == base


def save_index(index: DatasetIndex, path: Path) -> bool:
    """Save ``index`` for the next start when it knows more than the saved one; True if written.

    Temp file + rename, no fsync: a lost or torn file fails its checks and is simply rebuilt."""
    rows = index.covered_rows
    if rows == 0 or rows <= index.cached_rows:
        return False
    keys_blob = index._keys_blob(rows)
    offsets = index.offsets[:rows].tobytes()
    header = _IndexHeader(
        version=_INDEX_VERSION,
        byteorder=sys.byteorder,
        covered=index.covered,
        lines=index.covered_lines,
        rows=rows,
        keys_bytes=len(keys_blob),
        root=index.root,
        content=_content_hash(index).hexdigest(),
        payload=zlib.crc32(offsets, zlib.crc32(keys_blob)),
        bad=[(i, r) for i, r in sorted(index.bad.items()) if i < rows],
    )
    head = header.model_dump_json().encode()
    _write_replacing(path, _INDEX_MAGIC + len(head).to_bytes(4, "little") + head, keys_blob, offsets)
    return True


def _content_hash(index: DatasetIndex) -> HASH:
    """SHA-256 of the covered bytes, continuing the saved index's state when there is one."""
    view = memoryview(index.data)
    if index._saved is None:
        return hashlib.sha256(view[: index.covered])
    content = index._saved.content.copy()
    content.update(view[index._saved.header.covered : index.covered])
    return content


def _write_replacing(path: Path, *parts: bytes) -> None:
    """Temp file + rename (the temp file removed again if that fails)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            for part in parts:
                fh.write(part)
        os.replace(tmp, path)
    except OSError:
        with suppress(OSError):  # else the next start removes it
            tmp.unlink(missing_ok=True)
        raise


# -- parsing --------------------------------------------------------------------------------------
def _prior_counts(prefix: list[str], bases: set[str]) -> dict[str, int]:
    """base -> how many ``prefix`` keys have it (they are base-0, base-1, ...), for ``bases``.

    One C-level pass finds which bases occur at all (usually none: new rows are new prompts);
    only then is a set of the whole prefix built to count their repeats."""
    present = {f"{b}-0" for b in bases}.intersection(prefix)
    if not present:
        return {}
    known = set(prefix)
    counts: dict[str, int] = {}
    for first in present:
        base, n = first[:-2], 1
        while f"{base}-{n}" in known:
            n += 1
        counts[base] = n
    return counts


def _scan(index: DatasetIndex, skip_bad_rows: bool, limit: int | None) -> None:
    """Parse rows from ``index.covered`` (line ``covered_lines + 1``) to the end of the file or
    ``limit`` rows in all, appending keys, offsets and bad rows to ``index``. Occurrence numbers
    continue those of the rows already in ``index`` (a saved prefix)."""
    data, offsets, bad, prompts = index.data, index.offsets, index.bad, index._prompts
    prefix = len(index.keys)
    bases: list[str] = []
    repeats: list[int] = []  # occurrences of the row's base before it, within the scan
    seen: dict[str, int] = {}
    start = index.covered
    off = start
    lineno = index.covered_lines
    size = len(data)
    loads, dumps, blake2b = orjson.loads, orjson.dumps, hashlib.blake2b
    errors: list[str] = []
    for raw in (data if start == 0 else data[start:]).split(b"\n"):
        here = off
        off += len(raw) + 1
        lineno += 1
        if not raw or raw.isspace():
            continue
        rows = prefix + len(bases)
        if limit is not None and rows >= limit:
            break
        try:
            row = loads(raw)
        except orjson.JSONDecodeError:
            row = None
        prompt = row.get("prompt") if type(row) is dict else None
        try:
            if type(prompt) is str and len(row) == 1 and prompt.strip():
                base = blake2b(dumps(row), digest_size=10).hexdigest()  # the common row, inline
                prompts.append(prompt)
            else:
                base = _key_base(raw, index.root)
                prompts.append(None)
        except ValueError as exc:
            reason = f"line {lineno}: {exc}"
            if not skip_bad_rows:
                errors.append(reason)  # reported together at the end: fix them all in one go
            base = _bad_base(raw)
            bad[rows] = reason
            prompts.append(None)
        n = seen.get(base, 0)
        seen[base] = n + 1
        bases.append(base)
        repeats.append(n)
        offsets.append(here)
        if off <= size:  # the line ended with "\n": a saved index may vouch for it
            index.covered = off
            index.covered_rows = rows + 1
            index.covered_lines = lineno
    if errors:
        raise _bad_rows_error(index.path, errors)
    prior = _prior_counts(index.keys, set(seen)) if prefix and seen else {}
    if prior:
        index.keys.extend(f"{b}-{prior.get(b, 0) + n}" for b, n in zip(bases, repeats, strict=True))
    else:
        index.keys.extend(f"{b}-{n}" for b, n in zip(bases, repeats, strict=True))


def index_dataset(
    path: Path,
    *,
    skip_bad_rows: bool = False,
    max_samples: int | None = None,
    cache: Path | None = None,
    data_root: Path | None = None,
) -> DatasetIndex:
    """Key every row of a JSONL dataset. ``max_samples`` counts rows (good or bad) from the top.
    With ``cache`` (a file :func:`save_index` wrote), rows it vouches for are not parsed again.
    ``data_root``: the directory a row's ``cwd`` must lie under (default: the dataset's own)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {path}: {exc.strerror or exc}") from exc
    root = os.path.abspath(data_root if data_root is not None else path.parent)
    saved = _read_index(cache, data, root) if cache is not None else None
    index = DatasetIndex(path, data, [], array("q"), {}, root)
    if saved is not None:
        head = saved.header
        index.keys, index.offsets, index.bad = saved.keys, saved.offsets, dict(head.bad)
        index.cached_rows = index.covered_rows = head.rows
        index.covered, index.covered_lines = head.covered, head.lines
        index._saved = saved
        if max_samples is not None and max_samples < head.rows:
            del index.keys[max_samples:], index.offsets[max_samples:]
            index.bad = {i: r for i, r in index.bad.items() if i < max_samples}
            index.cached_rows = index.covered_rows = max_samples
            index._saved = None
        if index.bad and not skip_bad_rows:
            raise _bad_rows_error(path, [index.bad[i] for i in sorted(index.bad)])
    if index.cached_rows == (saved.header.rows if saved else 0):  # not cut by max_samples
        with _bulk_allocation():
            _scan(index, skip_bad_rows, max_samples)
    if not index.keys:
        raise DatasetError(f"{path}: the dataset is empty; expected one JSON object per line with a 'prompt'")
    return index


def load_dataset(
    path: Path, *, skip_bad_rows: bool = False, max_samples: int | None = None, data_root: Path | None = None
) -> LoadedDataset:
    """Parse a JSONL dataset into samples. ``max_samples`` counts rows (good or bad) from the top."""
    return index_dataset(
        path, skip_bad_rows=skip_bad_rows, max_samples=max_samples, data_root=data_root
    ).to_loaded()
