"""``trajforge batch`` output-directory failures: one line, exit code 2, no leftovers, exact ledger.

Issue 9, item 6: an output directory that is a file, that the user cannot write, or whose disk
fills up printed a Python traceback and left ``.tmp`` files. The real CLI in a subprocess against
a scripted endpoint on loopback; the unwritable case runs the CLI as an unprivileged user (as root
every mode bit is ignored), the disk-full case writes into a tiny real tmpfs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from trajforge.batch.ledger import Ledger
from trajforge.testing.scripted_server import Reply, ScriptedServer

TRAJFORGE = str(Path(sys.executable).with_name("trajforge"))
OUTPUT_FILES = ("trajectories.jsonl", "failed.jsonl", "filtered.jsonl")
NOBODY = 65534


def _dataset(path: Path, rows: int) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"prompt": f"task {i}"}) + b"\n" for i in range(rows)))
    return path


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """Answers every prompt at once with a ~20 KB final answer (so a few samples fill a disk)."""
    answer = "x" * 20_000
    with ScriptedServer(lambda body: Reply(content=answer, reasoning="thinking")).in_thread() as srv:
        yield srv.base_url


def _batch(
    endpoint: str, dataset: Path, output_dir: Path, *extra: str, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    args = [
        *prefix,
        TRAJFORGE,
        "batch",
        str(dataset),
        "--run-name",
        "run",
        "--output-dir",
        str(output_dir),
        "--model",
        "scripted",
        "--base-url",
        endpoint,
        "--api-key-env",
        "",
        "--toolsets",
        "terminal",
        "--sandbox",
        "local",  # the output directory is what is under test, not the sandbox
        "--progress",
        "none",
        *extra,
    ]
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)


def _assert_one_line_error(proc: subprocess.CompletedProcess, names: Path) -> str:
    """Exit code 2; stderr ends with exactly one ``error:`` line naming a path under ``names``."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert proc.stderr.rstrip("\n").splitlines()[-1] == errors[0]
    assert str(names) in errors[0], errors[0]
    return errors[0]


def _temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.tmp"))


def _delivered(run_dir: Path) -> list[int]:
    indexes = []
    for name in OUTPUT_FILES:
        path = run_dir / name
        if path.exists():
            indexes += [orjson.loads(line)["prompt_index"] for line in path.read_bytes().splitlines()]
    return sorted(indexes)


def _assert_shards_exact(run_dir: Path) -> None:
    """Every shard ends exactly where the ledger says its committed lines end."""
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        ends = ledger.committed_ends()
    finally:
        ledger.close()
    for shard in (run_dir / "shards").glob("*.jsonl"):
        assert shard.stat().st_size == ends.get(shard.name, 0), shard


@pytest.mark.parametrize("where", ["output-dir", "ancestor"])
def test_output_dir_is_a_file(tmp_path: Path, endpoint: str, where: str) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("not a directory\n")
    output_dir = blocker if where == "output-dir" else blocker / "nested"
    proc = _batch(endpoint, _dataset(tmp_path / "d.jsonl", 2), output_dir)
    line = _assert_one_line_error(proc, blocker)
    assert f"{blocker} is not a directory" in line and "--output-dir" in line
    assert blocker.read_text() == "not a directory\n"
    assert _temp_files(tmp_path) == []


@contextmanager
def _world_readable_dir() -> Iterator[Path]:
    """A directory an unprivileged user can traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="tf-outdir-"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_output_dir_not_writable_for_an_unprivileged_user(endpoint: str) -> None:
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to run the CLI as an unprivileged user")
        prefix: tuple[str, ...] = (
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
        )
    else:
        prefix = ()  # already unprivileged: the mode bits below apply to us
    with _world_readable_dir() as base:
        dataset = _dataset(base / "d.jsonl", 2)
        dataset.chmod(0o644)
        output_dir = base / "out"
        output_dir.mkdir(mode=0o555)
        output_dir.chmod(0o555)
        check = subprocess.run([*prefix, sys.executable, "-c", "import trajforge"], capture_output=True)
        if check.returncode != 0:
            pytest.skip(f"the unprivileged user cannot run this Python: {check.stderr[-300:]!r}")
        proc = _batch(endpoint, dataset, output_dir, prefix=prefix)
        line = _assert_one_line_error(proc, output_dir)
        assert f"cannot write to {output_dir}: permission denied" in line
        assert "choose another --output-dir" in line
        assert list(output_dir.iterdir()) == []


@contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); needs root in a mount ns")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_read_only_output_dir_as_root(tmp_path: Path, endpoint: str) -> None:
    """As root, permissions do not stop a write; a read-only file system does."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    with _tmpfs(tmp_path / "ro", "ro,size=64k") as output_dir:
        proc = _batch(endpoint, _dataset(tmp_path / "d.jsonl", 2), output_dir)
        line = _assert_one_line_error(proc, output_dir)
        assert f"cannot write to {output_dir}: read-only file system" in line


@pytest.mark.parametrize(
    ("size", "extra"),
    [
        ("64k", ()),  # full before the first sample: the ledger cannot be created
        ("256k", ("--concurrency", "1")),  # full after some samples were committed
        ("256k", ("--workers", "2", "--concurrency", "1")),  # the same in worker processes
    ],
)
def test_disk_full_is_one_line_and_resume_delivers_each_sample_once(
    tmp_path: Path, endpoint: str, size: str, extra: tuple[str, ...]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    rows = 20
    dataset = _dataset(tmp_path / "d.jsonl", rows)
    with _tmpfs(tmp_path / "disk", f"size={size}") as output_dir:
        run_dir = output_dir / "run"
        proc = _batch(endpoint, dataset, output_dir, *extra)
        line = _assert_one_line_error(proc, run_dir)
        assert "no space left on the device holding" in line
        assert "then continue with --resume" in line
        assert _temp_files(output_dir) == []  # the failed rewrites removed their temp files
        before = _delivered(run_dir)
        assert len(before) == len(set(before)) < rows

        subprocess.run(["mount", "-o", "remount,size=32m", str(output_dir)], check=True)
        if (run_dir / "shards").exists():  # (the ledger can be opened again now)
            _assert_shards_exact(run_dir)
        proc = _batch(endpoint, dataset, output_dir, *extra, "--resume")
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert _delivered(run_dir) == list(range(rows))  # every sample exactly once
        assert _temp_files(output_dir) == []
        _assert_shards_exact(run_dir)


def test_leftover_temp_files_are_removed_on_the_next_start(tmp_path: Path, endpoint: str) -> None:
    dataset = _dataset(tmp_path / "d.jsonl", 3)
    output_dir = tmp_path / "data"
    proc = _batch(endpoint, dataset, output_dir)
    assert proc.returncode == 0, proc.stderr
    run_dir = output_dir / "run"
    # What a run killed in the middle of an atomic rewrite leaves behind.
    planted = [
        run_dir / ".trajectories.jsonl.tmp",
        run_dir / ".failed.jsonl.tmp",
        run_dir / ".filtered.jsonl.tmp",
        run_dir / ".statistics.json.tmp",
        run_dir / ".run.json.tmp",
        run_dir / ".dataset.index.4242.tmp",
        run_dir / ".trajforge-probe-4242.tmp",
    ]
    for path in planted:
        path.write_bytes(b'{"torn": ')
    unrelated = run_dir / "notes.tmp"  # not ours: left alone
    unrelated.write_text("mine\n")

    _dataset(dataset, 5)  # two more rows, so the resume has work to do
    proc = _batch(endpoint, dataset, output_dir, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert [p for p in planted if p.exists()] == []
    assert unrelated.read_text() == "mine\n"
    assert _delivered(run_dir) == list(range(5))
    assert orjson.loads((run_dir / "statistics.json").read_bytes())["total_done"] == 5
