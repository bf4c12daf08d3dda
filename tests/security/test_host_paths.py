"""Host paths named by data. A task directory (``env eval terminal_bench --tasks DIR``, swe's
``tasks_dir``) and a dataset row may name any path they like, and the process that reads them is
often root. Nothing outside the task, or outside the operator's data root, may reach the prompt, an
item record or the sandbox:

- task directories are read without following any link (a walk from a directory fd, one
  component at a time with ``O_NOFOLLOW``): a task that holds a link is skipped with the reason,
  and a link that appears after loading (a swap between the check and the read) makes the read
  fail, never follow;
- a row's ``cwd`` resolves only under ``--data-root`` (default: the dataset's own directory), or the
  row is a bad row with its line number; the copy-in walks from the root's fd too, so a directory
  swapped for a link while it is copied is refused, not followed;
- setup file names (NUL, a component over 255 bytes, ``..``, absolute, no file named) are bad rows
  at load, never retried as a sandbox failure.

Every attack here leaked the host file (or was retried as ``sandbox_unavailable``) before the fix:
see the commit "before: ..." that added this file.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from trajforge.batch.dataset import DatasetError, index_dataset
from trajforge.envs import BaseEnv, EnvConfig, RolloutBackends, Rollouts, VerifierContext
from trajforge.envs.library.swe import SweConfig, SweEnv
from trajforge.envs.library.swe import shipped_dir as swe_shipped
from trajforge.envs.library.terminal_bench import TerminalBenchConfig, TerminalBenchEnv
from trajforge.sandbox.layout import copy_in
from trajforge.testing.scripted_model import ScriptedModel
from trajforge.testing.scripted_server import tool_then_answer
from trajforge.tools.builtin import default_registry

SECRET = "HOST-SECRET-4b9e"
bwrap_only = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _host(tmp: Path) -> Path:
    """Host files a hostile task links to (stand-ins for ~/.ssh, /etc/shadow, another user's data).
    Where a task needs a file to be accepted at all (tests/test.sh, solve.sh, a Dockerfile), the
    host stand-in has one: the attack is the link, not what happens to lie at its target."""
    host = tmp / "host"
    for d in ("tests", "solution", "environment", "dir", "swetests"):
        (host / d).mkdir(parents=True)
    (host / "secret.txt").write_text(SECRET + "\n")
    (host / "task.toml").write_text(f'version = "1.0"\n[metadata]\ncategory = "{SECRET}"\n')
    (host / "tests" / "test.sh").write_text('cat "$(dirname "$0")"/*.txt\nexit 1\n')
    (host / "tests" / "secret.txt").write_text(SECRET)
    (host / "solution" / "solve.sh").write_text("true\n")
    (host / "solution" / "secret.txt").write_text(SECRET)
    (host / "environment" / "Dockerfile").write_text("FROM x\nWORKDIR /app\nCOPY data.txt /app/\n")
    (host / "environment" / "data.txt").write_text(SECRET)
    (host / "Dockerfile").write_text(f"FROM x\nWORKDIR /app\nRUN echo {SECRET} > leaked\n")
    (host / "dir" / "f.txt").write_text(SECRET)
    _tb_task(host, "task", instruction=f"Say {SECRET}.")
    # swe: a task.toml whose instruction is the secret, a tests dir with the hidden test file name
    (host / "swe.toml").write_text(
        f'instruction = "{SECRET}"\nfail_to_pass = ["tests/test_hidden.py::test_transfer_moves_money"]\n'
    )
    (host / "swetests" / "test_hidden.py").write_text(f"# {SECRET}\n")
    shutil.copytree(swe_shipped() / "bank_transfer", host / "swetask")
    (host / "swetask" / "repo" / "ledger.py").write_text(f"# {SECRET}\n")
    return host


# ------------------------------------------------------------------------------- terminal_bench

DOCKERFILE = "FROM x\nWORKDIR /app\nCOPY data.txt /app/\nCOPY dir /app/dir\nCOPY *.cfg /app/\n"


def _tb_task(root: Path, name: str = "t", instruction: str = "Write done to /app/out.") -> Path:
    task = root / name
    (task / "environment" / "dir").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[metadata]\ncategory = "files"\n')
    (task / "instruction.md").write_text(instruction + "\n")
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (task / "environment" / "data.txt").write_text("data\n")
    (task / "environment" / "dir" / "f.txt").write_text("f\n")
    (task / "environment" / "a.cfg").write_text("a\n")
    (task / "environment" / "b.cfg").write_text("b\n")
    (task / "tests" / "test.sh").write_text("test -f /app/out\n")
    (task / "solution" / "solve.sh").write_text("echo done > /app/out\n")
    return task


# place -> (the path in the task that becomes a link, its target in the host dir)
TB_LINKS = {
    "instruction.md": ("instruction.md", "secret.txt"),
    "task.toml": ("task.toml", "task.toml"),
    "tests/": ("tests", "tests"),
    "solution/": ("solution", "solution"),
    "environment/": ("environment", "environment"),
    "Dockerfile": ("environment/Dockerfile", "Dockerfile"),
    "COPY source": ("environment/data.txt", "secret.txt"),
    "COPY directory": ("environment/dir", "dir"),
    "glob match": ("environment/a.cfg", "secret.txt"),
    "task directory": ("", "task"),
}
# read only while loading: a link that appears later changes nothing that is read
TB_LOAD_ONLY = {"task.toml", "Dockerfile"}


def _plant(where: Path, target: Path) -> None:
    if where.is_dir() and not where.is_symlink():
        shutil.rmtree(where)
    else:
        where.unlink()
    os.symlink(target, where)


async def _tb_reach(
    env: TerminalBenchEnv, items: list[dict[str, Any]], factory: Any
) -> tuple[str, dict[str, str]]:
    """Everything of the tasks that reaches the prompt, the item record or the sandbox, as one text
    (the sandbox is searched after each step), and the errors met on the way."""
    seen: list[str] = []
    errors: dict[str, str] = {}
    for item in items:
        seen.append(json.dumps(item))
        try:
            seen.append(env.format_prompt(item))
        except Exception as exc:
            errors["prompt"] = repr(exc)
        sb = await factory.create("leak")
        try:
            try:
                await env.prepare_sandbox(item, sb)
            except Exception as exc:
                errors["prepare"] = repr(exc)
            try:
                seen.append((await sb.exec(env.oracle_command(item), timeout=30)).output)
            except Exception as exc:
                errors["oracle"] = repr(exc)
            try:
                seen.append((await env.compute_reward(item, None, VerifierContext(sb))).reason)  # type: ignore[arg-type]
            except Exception as exc:
                errors["reward"] = repr(exc)
            seen.append((await sb.exec(f"grep -rs {SECRET} /workspace /tmp; true", timeout=30)).output)
        finally:
            await sb.close()
    return "\n".join(seen), errors


@bwrap_only
@pytest.mark.parametrize("place", list(TB_LINKS))
async def test_terminal_bench_task_with_a_link_is_skipped_and_leaks_nothing(place, tmp_path, factory):
    """A link anywhere in a task (the files it names, the trees it copies, the Dockerfile's COPY
    sources and glob matches, the task directory itself) makes the task unrunnable, with the
    reason; nothing of the link's target reaches the prompt, the item or the sandbox."""
    host, tasks = _host(tmp_path), tmp_path / "tasks"
    _tb_task(tasks, "ok")
    task = _tb_task(tasks, "t")
    rel, target = TB_LINKS[place]
    _plant(task / rel if rel else task, host / target)
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tasks)))
    reached, _ = await _tb_reach(env, env.eval_items(10), factory)
    assert SECRET not in reached
    assert "symbolic link" in env.skipped.get("t", ""), env.skipped
    assert [i["id"] for i in env.eval_items(10)] == ["ok"]  # the other task still runs


@bwrap_only
@pytest.mark.parametrize("place", [p for p in TB_LINKS if p not in TB_LOAD_ONLY])
async def test_terminal_bench_link_swapped_in_after_loading_is_not_followed(place, tmp_path, factory):
    """The check at load is not what protects the reads: a link that replaces a file or a
    directory after the task was loaded (the swap a racer makes between check and use) is refused
    by the read itself."""
    host, tasks = _host(tmp_path), tmp_path / "tasks"
    task = _tb_task(tasks, "t")
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tasks)))
    items = env.eval_items(10)
    assert [i["id"] for i in items] == ["t"]
    rel, target = TB_LINKS[place]
    _plant(task / rel if rel else task, host / target)
    reached, errors = await _tb_reach(env, items, factory)
    assert SECRET not in reached
    assert any("symbolic link" in e for e in errors.values()), errors


# -------------------------------------------------------------------------------------------- swe

SWE_LINKS = {
    "task.toml": ("task.toml", "swe.toml"),
    "repo/": ("repo", "dir"),
    "tests/": ("tests", "swetests"),
    "solution/": ("solution", "dir"),
    "task directory": ("", "swetask"),
}


def _swe_reach(env: SweEnv, items: list[dict[str, Any]]) -> tuple[str, dict[str, str]]:
    seen: list[str] = []
    errors: dict[str, str] = {}
    for item in items:
        seen.append(json.dumps(item))
        for name, read in (
            ("prompt", env.format_prompt),
            ("setup", env.setup_files),
            ("verifier", env.verifier_files),
            ("solution", env.solution_files),
        ):
            try:
                got = read(item)
            except Exception as exc:
                errors[name] = repr(exc)
                continue
            if isinstance(got, dict):
                seen.extend(
                    v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in got.values()
                )
            else:
                seen.append(str(got))
    return "\n".join(seen), errors


def _swe_tasks(tmp_path: Path) -> Path:
    tasks = tmp_path / "swe"
    shutil.copytree(swe_shipped() / "bank_transfer", tasks / "t")
    return tasks


@pytest.mark.parametrize("place", list(SWE_LINKS))
def test_swe_task_with_a_link_is_refused(place, tmp_path):
    host, tasks = _host(tmp_path), _swe_tasks(tmp_path)
    rel, target = SWE_LINKS[place]
    _plant(tasks / "t" / rel if rel else tasks / "t", host / target)
    env = SweEnv(SweConfig(tasks_dir=str(tasks)))
    try:
        items = env.eval_items(5)
    except ValueError as exc:  # swe refuses a bad task outright (EnvDataError), naming it
        assert "symbolic link" in str(exc) and SECRET not in str(exc)
        return
    reached, errors = _swe_reach(env, items)
    assert SECRET not in reached
    assert any("symbolic link" in e for e in errors.values()), errors


@pytest.mark.parametrize("place", [p for p in SWE_LINKS if p != "task.toml"])
def test_swe_link_swapped_in_after_loading_is_not_followed(place, tmp_path):
    host, tasks = _host(tmp_path), _swe_tasks(tmp_path)
    env = SweEnv(SweConfig(tasks_dir=str(tasks)))
    items = env.eval_items(5)
    rel, target = SWE_LINKS[place]
    _plant(tasks / "t" / rel if rel else tasks / "t", host / target)
    reached, errors = _swe_reach(env, items)
    assert SECRET not in reached
    assert any("symbolic link" in e for e in errors.values()), errors


def test_swe_item_naming_a_task_dir_outside_tasks_dir_is_refused(tmp_path):
    """``batch --env swe`` judges a dataset row as the item: its ``task_dir`` is data, so it is
    resolved under the env's ``tasks_dir`` (the operator's root), never taken as a host path."""
    host, tasks = _host(tmp_path), _swe_tasks(tmp_path)
    env = SweEnv(SweConfig(tasks_dir=str(tasks)))
    item = env.eval_items(1)[0]
    for task_dir in (str(host / "swetask"), "../host/swetask", "t/../../host/swetask"):
        reached, errors = _swe_reach(env, [{**item, "task_dir": task_dir}])
        assert SECRET not in reached, task_dir
        assert set(errors) == {"setup", "verifier", "solution"}, errors
        assert all("outside" in e for e in errors.values()), errors
    # the same task named relative to tasks_dir, or by its own absolute path, still works
    for task_dir in ("t", str(tasks / "t")):
        _, errors = _swe_reach(env, [{**item, "task_dir": task_dir}])
        assert errors == {}, (task_dir, errors)


# ------------------------------------------------------------------------------ dataset rows: cwd


def _rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_a_row_cwd_resolves_only_under_the_data_root(tmp_path):
    data = tmp_path / "data"
    (data / "proj").mkdir(parents=True)
    host = _host(tmp_path)
    dataset = _rows(
        data / "d.jsonl",
        [
            {"prompt": "abs outside", "cwd": str(host)},
            {"prompt": "dotdot", "cwd": "../host"},
            {"prompt": "relative", "cwd": "proj"},
            {"prompt": "abs inside", "cwd": str(data / "proj")},
            {"prompt": "inner dotdot", "cwd": "proj/../../host"},
            {"prompt": "nul", "cwd": "proj\u0000x"},
        ],
    )
    index = index_dataset(dataset, skip_bad_rows=True)
    assert sorted(index.bad) == [0, 1, 4, 5], index.bad
    for i, reason in index.bad.items():
        assert reason.startswith(f"line {i + 1}: ") and "cwd" in reason, reason
    samples, bad = index.samples([0, 1, 2, 3, 4, 5])
    root = str(data.resolve())
    assert [s.cwd for s in samples] == [f"{root}/./proj", f"{root}/./proj"]
    with pytest.raises(DatasetError, match="line 1: .*cwd"):
        index_dataset(dataset)  # without --skip-bad-rows the run does not start
    # the operator names a wider root: the absolute path outside the dataset's directory is fine
    # then (relative paths are relative to the root: "../host" is outside it still)
    wide = index_dataset(dataset, skip_bad_rows=True, data_root=tmp_path)
    assert sorted(wide.bad) == [1, 4, 5]
    assert wide.samples([0])[0][0].cwd == f"{tmp_path.resolve()}/./host"


SETUP_NAMES = [
    ("a\u0000b", "NUL"),
    ("x" * 256, "255 bytes"),
    ("dir/" + "\u00e9" * 128 + "/f", "255 bytes"),  # 128 characters, 256 bytes of UTF-8
    ("../x", ".."),
    ("a/../../x", ".."),
    ("/etc/cron.d/x", "absolute"),
    (".", "names no file"),
    ("", "names no file"),
]


@pytest.mark.parametrize(("name", "why"), SETUP_NAMES)
def test_setup_file_names_are_checked_when_the_dataset_is_read(tmp_path, name, why):
    dataset = _rows(tmp_path / "d.jsonl", [{"prompt": "ok"}, {"prompt": "p", "setup_files": {name: "x"}}])
    index = index_dataset(dataset, skip_bad_rows=True)
    assert list(index.bad) == [1]
    assert index.bad[1].startswith("line 2: ") and why in index.bad[1], index.bad[1]
    ok = _rows(tmp_path / "ok.jsonl", [{"prompt": "p", "setup_files": {"a/" + "x" * 255: "x", "b": "y"}}])
    assert index_dataset(ok).bad == {}  # 255 bytes is allowed


async def test_batch_rows_with_host_paths_are_bad_rows_not_retries(
    tmp_path, tmp_path_factory, scripted_server, scripted_batch_config
):
    """End to end (real endpoint on loopback, real sandboxes): a row whose cwd is a host directory
    outside the data root, and rows whose setup file names the sandbox cannot hold, end failed with
    ``bad_row`` and their line number after one attempt; a cwd under the root is copied in."""
    from trajforge.batch.runner import run_batch

    host = _host(tmp_path_factory.mktemp("elsewhere"))  # outside the dataset's directory
    (host / "f.txt").write_text(SECRET)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "f.txt").write_text("PROJECT-FILE")
    srv = await scripted_server(tool_then_answer(calls_per_sample=1, command="cat f.txt; true"))
    rows = [
        {"prompt": "outside", "cwd": str(host)},
        {"prompt": "inside", "cwd": "proj"},
        {"prompt": "nul", "setup_files": {"a\u0000b": "x"}},
        {"prompt": "long", "setup_files": {"x" * 300: "x"}},
    ]
    cfg = scripted_batch_config(rows, srv.base_url, skip_bad_rows=True, concurrency=1)
    await run_batch(cfg)
    lines = {
        r["prompt_index"]: r
        for name in ("trajectories.jsonl", "failed.jsonl", "filtered.jsonl")
        for r in _lines(cfg.run_dir / name)
    }
    everything = b"".join(p.read_bytes() for p in cfg.run_dir.rglob("*") if p.is_file())
    assert SECRET.encode() not in everything
    for i in (0, 2, 3):
        assert lines[i]["status"] == "failed", lines[i]
        assert lines[i]["reason"].startswith(f"bad_row: line {i + 1}: "), lines[i]["reason"]
        assert lines[i]["attempts"] <= 1, lines[i]
    assert "PROJECT-FILE" in json.dumps(lines[1]), lines[1]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


# --------------------------------------------------------------------- the copy-in under a racer

_libc = ctypes.CDLL(None, use_errno=True)
_RENAME_EXCHANGE = 2


def _racer(a: Path, b: Path, stop: threading.Event, count: list[int]) -> None:
    """Swap ``a`` (a directory) and ``b`` (a link to a host directory) as fast as possible."""
    ba, bb = os.fsencode(a), os.fsencode(b)
    while not stop.is_set():
        _libc.renameat2(-100, ba, -100, bb, _RENAME_EXCHANGE)
        count[0] += 1


def _leaked(dest: Path) -> bool:
    """A regular file under ``dest`` (links not followed) holding the host secret."""
    for dirpath, _, files in os.walk(dest):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and SECRET.encode() in Path(path).read_bytes():
                return True
    return False


@pytest.mark.parametrize("cwd", ["proj", "proj/d"])
def test_copy_in_cannot_be_raced_out_of_the_data_root(cwd, tmp_path):
    """A background thread swaps ``proj/d`` with a link to a host directory while rows with
    ``cwd`` ``proj`` (a directory inside is swapped) and ``proj/d`` (the cwd itself is swapped) are
    copied in, again and again: no copy ever holds a host byte."""
    root = tmp_path / "data"
    (root / "proj" / "d").mkdir(parents=True)
    (root / "proj" / "d" / "f.txt").write_text("INSIDE")
    host = tmp_path / "host"
    host.mkdir()
    (host / "f.txt").write_text(SECRET)
    os.symlink(host, root / "proj" / "l")
    stop, count = threading.Event(), [0]
    racer = threading.Thread(target=_racer, args=(root / "proj" / "d", root / "proj" / "l", stop, count))
    racer.start()
    outcomes = {"copied": 0, "refused": 0, "escaped": 0}
    try:
        for i in range(3000):
            dest = tmp_path / f"dest{i}"
            dest.mkdir()
            try:
                copy_in(f"{root}/./{cwd}", dest)
                outcomes["copied"] += 1
            except (ValueError, OSError):  # DataPathError is a ValueError
                outcomes["refused"] += 1
            outcomes["escaped"] += _leaked(dest)
            shutil.rmtree(dest)
    finally:
        stop.set()
        racer.join()
    assert outcomes["escaped"] == 0, outcomes
    assert count[0] > 1000 and outcomes["copied"] > 100, (count, outcomes)


def test_copy_in_refuses_a_cwd_through_a_link_and_copies_inner_links_as_links(tmp_path):
    root = tmp_path / "data"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "f.txt").write_text("INSIDE")
    host = _host(tmp_path)
    os.symlink(host, root / "hostlink")
    os.symlink(host / "secret.txt", root / "proj" / "key")  # inside the tree: copied as a link
    for cwd in ("hostlink", "hostlink/dir"):
        dest = tmp_path / f"dest-{cwd.replace('/', '-')}"
        dest.mkdir()
        with pytest.raises(ValueError, match="symbolic link"):
            copy_in(f"{root}/./{cwd}", dest)
        assert not _leaked(dest)
    dest = tmp_path / "dest"
    dest.mkdir()
    copy_in(f"{root}/./proj", dest)
    assert (dest / "f.txt").read_text() == "INSIDE"
    assert (dest / "key").is_symlink() and not _leaked(dest)  # resolved by the sandbox, in its own view


# -------------------------------------------------------------------- env items: setup file names


class _SetupEnv(BaseEnv):
    name = "setup_names"

    def generate(self, index: int, *, split: str) -> dict[str, Any]:
        return {"id": "bad", "prompt": "p", "setup_files": {"a\u0000b": "x", "x" * 300: "y"}}

    def setup_files(self, item: dict[str, Any]) -> dict[str, Any]:
        return dict(item["setup_files"])

    async def compute_reward(self, item: Any, result: Any, ctx: Any) -> float:
        return 1.0


@bwrap_only
async def test_env_item_with_bad_setup_file_names_fails_as_bad_data(factory):
    """An env's items are data too: names the sandbox cannot hold fail the episode as a bad item
    (with the names' problem), not as a sandbox failure."""
    env = _SetupEnv(EnvConfig(enabled_toolsets=["terminal"]))
    rollouts = Rollouts(env, RolloutBackends(ScriptedModel(["ok"]), factory, default_registry()))
    ep = await rollouts.episode(env.generate(0, split="eval"))
    assert ep.status == "failed" and ep.reward.value is None and ep.score == 0.0  # never judged
    assert "bad item" in (ep.reason or "") and "NUL" in (ep.reason or ""), ep.reason
    assert not (ep.reason or "").startswith("sandbox"), ep.reason


def test_copy_in_keeps_modes_and_times_drops_set_id_bits_and_refuses_special_files(tmp_path):
    root = tmp_path / "data"
    (root / "proj" / "bin").mkdir(parents=True)
    tool = root / "proj" / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o4755)
    os.utime(tool, ns=(1_000_000_000, 2_000_000_000))
    dest = tmp_path / "dest"
    dest.mkdir()
    copy_in(f"{root}/./proj", dest)
    st = (dest / "bin" / "tool").lstat()
    assert oct(st.st_mode & 0o7777) == oct(0o755) and st.st_mtime_ns == 2_000_000_000
    os.mkfifo(root / "proj" / "fifo")  # opening it would block the copy forever
    again = tmp_path / "again"
    again.mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        copy_in(f"{root}/./proj", again)


def test_a_fifo_in_a_task_is_never_opened(tmp_path):
    tasks = tmp_path / "tasks"
    task = _tb_task(tasks, "t")
    (task / "instruction.md").unlink()
    os.mkfifo(task / "instruction.md")  # a read would block the loader forever
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tasks)))
    assert "not a regular file" in env.skipped["t"], env.skipped


@bwrap_only
async def test_verifier_uploads_follow_no_link_out_of_the_tree(tmp_path, factory):
    """``VerifierContext.upload_dir``/``upload_file`` (a reward putting task files in place): the
    tree, its own name and a file's name are walked without following links."""
    host = _host(tmp_path)
    tests = tmp_path / "task" / "tests"
    tests.mkdir(parents=True)
    (tests / "t.sh").write_text("true\n")
    os.symlink(host / "dir", tmp_path / "task" / "linked")  # the tree's own name is a link
    os.symlink(host / "secret.txt", tmp_path / "task" / "key")
    sb = await factory.create("upload")
    try:
        ctx = VerifierContext(sb)
        assert await ctx.upload_dir(tests, "up") == ["up/t.sh"]
        with pytest.raises(ValueError, match="symbolic link"):
            await ctx.upload_dir(tmp_path / "task" / "linked", "bad")
        with pytest.raises(ValueError, match="symbolic link"):
            await ctx.upload_file(tmp_path / "task" / "key", "k")
        os.symlink(host / "secret.txt", tests / "inner")
        with pytest.raises(ValueError, match="symbolic link"):
            await ctx.upload_dir(tests, "up2")
        found = await sb.exec(f"grep -rs {SECRET} /workspace /tmp; true")
        assert SECRET not in found.output
    finally:
        await sb.close()
