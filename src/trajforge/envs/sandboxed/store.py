"""Where env files written by the RL agent's model live on the host, apart from the operator's.

The RL agent writes env files in its sandbox (``envs/NAME.py``); ``rl_list_environments`` copies
them here, never into the operator's ``--envs-dir``. A store is a directory holding:

- ``NAME.SHA16.py``: one immutable copy per content (``SHA16`` = the first 16 hex digits of its
  sha256), mode 0444. A new version of ``NAME`` is a new file; an approval names one content.
- :data:`MANIFEST`: the marker that makes the directory a store, and the record of each version
  (full sha256, size, when and from where it was copied, the classes read statically, and the
  operator's approval: by whom, when).

Nothing here imports or runs a stored file. :func:`trajforge.envs.catalog.env_class` refuses to
import any ``.py`` in a directory that holds a manifest, so an agent's file is never mistaken for
an operator's env; it runs only as ``agent-env:PATH:Class`` (:func:`parse_ref`), through the env
host in its own sandbox (:mod:`trajforge.envs.sandboxed.proxy`), and only when approved.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajforge.envs.sandboxed.static import StaticReadError, read_env_classes

MANIFEST = ".trajforge-agent-envs.json"
REF_PREFIX = "agent-env:"
LIST_PREFIX = "agent/"
MAX_FILE_BYTES = 256 * 1024
MAX_NAMES = 64
MAX_VERSIONS = 20
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_FILE = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,63})\.([0-9a-f]{16})\.py")
_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_NOTICE = (
    "trajforge agent env store: these files were written by an RL agent's model. They are never "
    "imported on the host; they run only in the env sandbox, after the operator approved them."
)


class AgentEnvError(ValueError):
    """An agent env that cannot be used as asked; the message says what to do."""


class AgentEnvNotApproved(AgentEnvError):
    """The operator has not approved this content of an agent-written env: nothing of it runs."""


@dataclass(frozen=True)
class AgentEnvRef:
    """``agent-env:/store/NAME.SHA16.py:Class``: one content of one agent env, one class."""

    store: Path
    name: str
    sha16: str
    class_name: str

    @property
    def path(self) -> Path:
        return self.store / f"{self.name}.{self.sha16}.py"

    def __str__(self) -> str:
        return f"{REF_PREFIX}{self.path}:{self.class_name}"

    @property
    def label(self) -> str:
        """How the agent and the operator see it: ``agent/NAME:Class``."""
        return f"{LIST_PREFIX}{self.name}:{self.class_name}"


def is_agent_ref(ref: str) -> bool:
    return ref.startswith(REF_PREFIX)


def parse_ref(ref: str) -> AgentEnvRef:
    """The parts of an ``agent-env:`` reference; ``AgentEnvError`` for anything not exactly that."""
    body = ref.removeprefix(REF_PREFIX)
    where, sep, cls = body.rpartition(":")
    path = Path(where)
    m = _FILE.fullmatch(path.name)
    if not sep or not path.is_absolute() or m is None or not _CLASS.fullmatch(cls):
        raise AgentEnvError(
            f"{ref!r} is not an agent env reference (agent-env:/STORE/NAME.SHA16.py:ClassName)"
        )
    return AgentEnvRef(path.parent, m.group(1), m.group(2), cls)


def is_store(directory: Path) -> bool:
    """Whether ``directory`` holds agent-written env files (its manifest is there)."""
    return (directory / MANIFEST).exists()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class StoredVersion:
    """One content of an agent env, as the manifest records it."""

    name: str
    sha256: str
    record: dict[str, Any]
    path: Path

    @property
    def approved(self) -> bool:
        return bool(self.record.get("approved"))

    @property
    def classes(self) -> list[dict[str, Any]]:
        return list(self.record.get("classes") or [])

    def ref(self, class_name: str) -> AgentEnvRef:
        return AgentEnvRef(self.path.parent, self.name, self.sha256[:16], class_name)


class AgentEnvStore:
    """A store directory (created with its manifest on first use)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory).absolute()

    # ------------------------------------------------------------------ manifest
    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The manifest, read and written back under an exclusive lock (two agents, one store)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = self._read_manifest()
            yield data
            self._write_manifest(data)
        finally:
            os.close(fd)

    def _read_manifest(self) -> dict[str, Any]:
        path = self.dir / MANIFEST
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {"notice": _NOTICE, "envs": {}}
        with os.fdopen(fd, "rb") as f:
            raw = f.read(16 * 1024 * 1024)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise AgentEnvError(f"{path} is not valid JSON ({exc}); fix or remove it") from None
        if not isinstance(data, dict) or not isinstance(data.get("envs"), dict):
            raise AgentEnvError(f"{path} is not an agent env manifest")
        return data

    def _write_manifest(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".manifest-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / MANIFEST)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def manifest(self) -> dict[str, Any]:
        if not is_store(self.dir):
            return {"notice": _NOTICE, "envs": {}}
        return self._read_manifest()

    # ------------------------------------------------------------------ writing
    def ingest(self, name: str, data: bytes, *, source: str) -> StoredVersion:
        """Keep ``data`` as the latest version of ``name`` (a new immutable file when the content
        is new; an approval of an earlier content does not carry over)."""
        if not _NAME.fullmatch(name):
            raise AgentEnvError(f"env file name {name!r}: letters, digits and _ only (NAME.py)")
        if len(data) > MAX_FILE_BYTES:
            raise AgentEnvError(
                f"{name}.py is {len(data)} bytes; agent env files are at most {MAX_FILE_BYTES}"
            )
        digest = sha256(data)
        try:
            classes = [c.row() for c in read_env_classes(data, f"{name}.py")]
            problem = None
        except StaticReadError as exc:
            classes, problem = [], str(exc)
        with self._locked() as manifest:
            envs = manifest["envs"]
            if name not in envs and len(envs) >= MAX_NAMES:
                raise AgentEnvError(f"the agent env store holds {MAX_NAMES} envs already; reuse a name")
            entry = envs.setdefault(name, {"versions": {}})
            versions: dict[str, Any] = entry["versions"]
            path = self.dir / f"{name}.{digest[:16]}.py"
            if digest not in versions:
                _write_new(path, data)
                versions[digest] = {
                    "size": len(data),
                    "copied_at": time.time(),
                    "source": source,
                    "classes": classes,
                    "problem": problem,
                    "approved": None,
                }
            entry["latest"] = digest
            _prune(self.dir, name, versions, keep=digest)
            record = dict(versions[digest])
        return StoredVersion(name, digest, record, path)

    def approve(self, name: str, digest: str, *, by: str) -> StoredVersion:
        """Record the operator's approval of one content (the whole sha256 must match)."""
        with self._locked() as manifest:
            versions = manifest["envs"].get(name, {}).get("versions", {})
            if digest not in versions:
                raise AgentEnvError(f"no version {digest[:16]} of agent env {name!r} in {self.dir}")
            path = self.dir / f"{name}.{digest[:16]}.py"
            if sha256(_read_bounded(path)) != digest:
                raise AgentEnvError(f"{path} no longer holds the content recorded for it; not approved")
            versions[digest]["approved"] = {"by": by, "at": time.time()}
            record = dict(versions[digest])
        return StoredVersion(name, digest, record, path)

    # ------------------------------------------------------------------ reading
    def latest(self) -> list[StoredVersion]:
        """The latest version of every env, by name."""
        out = []
        for name, entry in sorted(self.manifest()["envs"].items()):
            digest = entry.get("latest")
            if digest in entry.get("versions", {}):
                out.append(
                    StoredVersion(
                        name, digest, entry["versions"][digest], self.dir / f"{name}.{digest[:16]}.py"
                    )
                )
        return out

    def version(self, name: str, sha16: str) -> StoredVersion:
        for digest, record in self.manifest()["envs"].get(name, {}).get("versions", {}).items():
            if digest.startswith(sha16):
                return StoredVersion(name, digest, record, self.dir / f"{name}.{digest[:16]}.py")
        raise AgentEnvError(f"no version {sha16} of agent env {name!r} in {self.dir}")

    def read_approved(self, ref: AgentEnvRef) -> bytes:
        """The bytes of ``ref``'s file, checked against the manifest's sha256 and approval.
        The bytes returned are the ones that run: the env host gets them, never the path."""
        if ref.store != self.dir or not is_store(self.dir):
            raise AgentEnvError(f"{ref.store} is not an agent env store (no {MANIFEST})")
        version = self.version(ref.name, ref.sha16)
        data = _read_bounded(ref.path)
        if sha256(data) != version.sha256:
            raise AgentEnvError(f"{ref.path} does not hold the content the store recorded; not run")
        if not version.approved:
            raise AgentEnvNotApproved(not_approved_message(ref.label, version.sha256))
        return data


def not_approved_message(label: str, digest: str) -> str:
    return (
        f"{label} was written by the RL agent and the operator has not approved this content "
        f"(sha256 {digest[:16]}); nothing of it ran. It runs (in the env sandbox) once approved: "
        "answer yes when the interactive REPL asks, start `trajforge rl agent` with "
        "--trust-agent-envs, or run `trajforge rl agent-envs --approve NAME`"
    )


def _read_bounded(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise AgentEnvError(f"{path} is over {MAX_FILE_BYTES} bytes")
    return data


def _write_new(path: Path, data: bytes) -> None:
    """Write ``path`` once (temp file + rename, read-only); an existing file of that content stays."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".env-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o444)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _prune(directory: Path, name: str, versions: dict[str, Any], *, keep: str) -> None:
    """At most MAX_VERSIONS per name: the oldest unapproved versions go first."""
    while len(versions) > MAX_VERSIONS:
        candidates = sorted(
            (d for d, r in versions.items() if d != keep and not r.get("approved")),
            key=lambda d: versions[d].get("copied_at", 0),
        ) or sorted((d for d in versions if d != keep), key=lambda d: versions[d].get("copied_at", 0))
        if not candidates:
            return
        gone = candidates[0]
        del versions[gone]
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{name}.{gone[:16]}.py").unlink()
