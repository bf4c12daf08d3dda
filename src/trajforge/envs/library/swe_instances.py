"""SWE-bench instances for the ``swe`` env, on repositories checked out locally.

An instance is a row of a SWE-bench dataset in the ``swebench`` package's format: ``instance_id``,
``repo`` (``owner/name``), ``base_commit``, ``patch`` (the reference fix), ``test_patch``,
``problem_statement``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` (JSON strings, as in the published
datasets, or lists), ``version``, and swebench 5's ``log_parser``, ``eval_type`` and
``eval_script``. Rows come from a local JSON or JSONL file (``instances`` in the env config).

SWE-bench's harness runs each instance in a Docker image built from the repository at
``environment_setup_commit`` with its conda environment; building (or pulling) those images needs
the internet, which trajforge never uses. Here the repository comes from a **prepared local
checkout** instead: ``repos_dir/OWNER__NAME`` (or ``repos_dir/OWNER/NAME``), a git clone that holds
``base_commit``. The sandbox's workdir gets the tree at ``base_commit`` (``git archive``); the
hidden tests are the ``test_patch``'s files as they are after applying it at ``base_commit``
(computed here, on the host, with ``git apply`` in a scratch directory); the oracle writes the
files as they are after the ``patch``. The test command is the one in the instance's
``eval_script`` between its start and end markers (else ``test_cmd``, else ``pytest -rA`` over the
test patch's files), run by the sandbox's ``python3`` with the packages of ``test_env_dir``.

A checkout is the operator's data: git runs on it with every program-running setting off.

Known limits: the workdir has no ``.git``; the tree's symbolic links are left out and its files
lose their executable bits (the sandbox's copy-in writes regular files); nothing of SWE-bench's
per-repository environment set-up (``pre_install``, ``install``, building C extensions) is run,
so a repository whose tests need a build step, or another Python than the sandbox's ``python3``,
needs that prepared in ``test_env_dir`` by the operator.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from trajforge.envs.base import EnvDataError

REQUIRED = ("instance_id", "repo", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
_GIT_SAFE = (
    "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.pager=cat",
    "-c", "protocol.allow=never", "-c", "core.attributesFile=/dev/null",
)  # fmt: skip
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_NUL = "\0"


def _ids(value: Any, field: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise EnvDataError(f"{where}: {field} is not a JSON list of test ids") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EnvDataError(f"{where}: {field} must be a list of test ids")
    return list(value)


def load_instances(path: Path) -> list[dict[str, Any]]:
    """The instances of a JSON list or JSONL file, checked: each names what it lacks."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvDataError(f"cannot read SWE-bench instances {path}: {exc}") from None
    try:
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except ValueError as exc:
        raise EnvDataError(f"SWE-bench instances {path}: not JSON or JSONL ({exc})") from None
    out = []
    for n, row in enumerate(rows, 1):
        where = f"{path} row {n}"
        if not isinstance(row, dict):
            raise EnvDataError(f"{where}: an instance is an object")
        missing = [k for k in REQUIRED if not row.get(k) and row.get(k) != []]
        if missing:
            raise EnvDataError(f"{where}: lacks {', '.join(missing)} (the swebench instance fields)")
        where = f"{path} instance {row['instance_id']}"
        row = dict(row)
        row["FAIL_TO_PASS"] = _ids(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
        row["PASS_TO_PASS"] = _ids(row["PASS_TO_PASS"], "PASS_TO_PASS", where)
        if not row["FAIL_TO_PASS"]:
            raise EnvDataError(f"{where}: FAIL_TO_PASS is empty (nothing to resolve)")
        if not re.fullmatch(r"[0-9a-fA-F]{7,40}", str(row["base_commit"])):
            raise EnvDataError(f"{where}: base_commit {row['base_commit']!r} is not a commit id")
        out.append(row)
    if not out:
        raise EnvDataError(f"no SWE-bench instances in {path}")
    ids = [r["instance_id"] for r in out]
    if len(set(ids)) != len(ids):
        raise EnvDataError(f"{path}: instance ids repeat")
    return out


def patch_files(patch: str) -> list[str]:
    """The repository paths a unified git diff touches (old and new names). A patch comes from
    the dataset: a name that is absolute or climbs out (``..``) is refused here, before any path
    built from it is written or read on the host (``git apply`` would refuse it too, later)."""
    names: list[str] = []
    for a, b in _DIFF_FILE.findall(patch):
        for name in (a, b):
            parts = PurePosixPath(name).parts
            if name.startswith("/") or ".." in parts or ".git" in parts:
                raise EnvDataError(f"a patch names {name!r}: only paths inside the repository may be patched")
            if name not in names:
                names.append(name)
    return names


def instance_test_command(instance: dict[str, Any]) -> str:
    """The instance's test command: the lines of its ``eval_script`` between swebench's start and
    end markers; else ``test_cmd`` (our field) or ``pytest -rA``, over the test patch's files."""
    from trajforge.envs.library.swe_grading import markers

    start, end, _ = markers()
    lines = str(instance.get("eval_script") or "").splitlines()
    begin = next((i for i, line in enumerate(lines) if start in line), None)
    stop = next((i for i, line in enumerate(lines) if end in line), None)
    if begin is not None and stop is not None and stop > begin + 1:
        return "\n".join(lines[begin + 1 : stop])
    files = [f for f in patch_files(instance["test_patch"]) if f.endswith(".py")]
    return f"{instance.get('test_cmd') or 'pytest -rA'} {' '.join(files)}".strip()


class LocalRepos:
    """Prepared checkouts under ``root``; reads trees at a commit and applies patches to them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def checkout(self, repo: str) -> Path:
        owner, _, name = repo.partition("/")
        if not owner or not name or ".." in (owner, name) or "/" in name:
            raise EnvDataError(f"repo {repo!r} is not OWNER/NAME")
        for candidate in (self.root / f"{owner}__{name}", self.root / owner / name):
            if (candidate / ".git").exists():
                return candidate
        raise EnvDataError(
            f"no local checkout of {repo} in {self.root} (looked for {owner}__{name}/ and {owner}/{name}/): "
            f"clone it there once (`git clone https://github.com/{repo} {self.root / f'{owner}__{name}'}`, "
            "on a machine with the internet). Building SWE-bench's official images needs the internet too; "
            "trajforge runs the instance on the prepared checkout instead"
        )

    def _git(self, repo: str, *args: str, stdin: bytes | None = None) -> bytes:
        where = self.checkout(repo)
        try:
            done = subprocess.run(
                ["git", *_GIT_SAFE, "-C", str(where), *args],
                input=stdin,
                capture_output=True,
                timeout=300,
                env={
                    "PATH": "/usr/bin:/bin",
                    "GIT_CONFIG_NOSYSTEM": "1",
                    "GIT_CONFIG_GLOBAL": "/dev/null",
                    "HOME": "/nonexistent",
                },
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvDataError(f"git on {where} failed: {exc}") from None
        if done.returncode != 0:
            raise EnvDataError(
                f"git {args[0]} on {where}: {done.stderr.decode(errors='replace').strip()[-400:]}"
            )
        return done.stdout

    def tree(self, repo: str, commit: str, paths: Iterable[str] | None = None) -> dict[str, bytes]:
        """The regular files of ``commit`` (or only ``paths`` of it), from ``git archive``."""
        wanted = None if paths is None else tuple(paths)
        if wanted == ():
            return {}
        return dict(_tree(self, repo, commit, wanted))

    def apply(self, repo: str, commit: str, patch: str) -> dict[str, bytes | None]:
        """The files ``patch`` touches, as they are after applying it at ``commit`` (None: deleted)."""
        touched = patch_files(patch)
        if not touched:
            raise EnvDataError("a patch with no `diff --git` file headers")
        listed = set(
            self._git(repo, "ls-tree", "-r", "--name-only", "-z", commit, "--", *touched).decode().split(_NUL)
        )
        base = self.tree(repo, commit, [p for p in touched if p in listed])
        with tempfile.TemporaryDirectory(prefix="trajforge-swe-apply-") as tmp:
            root = Path(tmp)
            for rel, data in base.items():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(data)
            try:
                done = subprocess.run(
                    ["git", *_GIT_SAFE, "apply", "--whitespace=nowarn", "-"],
                    input=patch.encode(),
                    cwd=root,
                    capture_output=True,
                    timeout=120,
                    env={
                        "PATH": "/usr/bin:/bin",
                        "GIT_CEILING_DIRECTORIES": str(root.parent),
                        "HOME": "/nonexistent",
                    },
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise EnvDataError(f"git apply failed: {exc}") from None
            if done.returncode != 0:
                raise EnvDataError(
                    f"the patch does not apply at {commit[:12]}: {done.stderr.decode(errors='replace').strip()[-400:]}"
                )
            return {rel: (root / rel).read_bytes() if (root / rel).is_file() else None for rel in touched}


@lru_cache(maxsize=2)  # a whole tree each: the latest instances' repositories
def _tree(
    repos: LocalRepos, repo: str, commit: str, paths: tuple[str, ...] | None
) -> tuple[tuple[str, bytes], ...]:
    archive = repos._git(repo, "archive", "--format=tar", commit, *(("--", *paths) if paths else ()))
    out = []
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                fh = tar.extractfile(member)
                if fh is not None:
                    out.append((member.name, fh.read()))
    return tuple(out)


def prompt(instance: dict[str, Any]) -> str:
    return (
        f"You are working in a checkout of {instance['repo']} (your current directory), at commit "
        f"{str(instance['base_commit'])[:12]}. Resolve this issue:\n\n{str(instance.get('problem_statement') or '').strip()}\n\n"
        "Change the repository's code. Hidden tests will be run against your changes after you finish."
    )
