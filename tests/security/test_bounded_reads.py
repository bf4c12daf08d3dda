"""Bounded reads on the host side. A rollout controls every file its sandbox holds, and a sparse
file costs it no disk: ``truncate -s 1G f`` is free in the sandbox and 1 GB of host memory for a
reward that reads it whole. Every host-side read of sandbox data (``VerifierContext.read_file``
and its ``cat`` path, ``ctx.sandbox.read_bytes`` as the shipped checkers use it, verifier command
output, ``download_file``/``download_dir``, ``snapshot``, yc_bench's kept log) has a limit
(``EnvConfig.max_read_bytes``, default 64 MiB), checked before the bytes are read (the file's size
on the opened fd, then at most limit + 1 bytes), and fails with an error that names the limit and
how to raise it. Kept files are bounded and say when they were cut.

Before the fix (commit "before: ..." that added this file) the shipped write_file checker with 4
concurrent rollouts grew the host process by 4-5 GB, and yc_bench kept a 20 MB sparse log whole.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trajforge.envs import KeptFiles, VerifierContext, snapshot
from trajforge.envs.library.yc_bench import YcBenchEnv
from trajforge.sandbox import SandboxConfig, close_factory, create_sandbox_factory

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
PROBE = Path(__file__).with_name("bounded_probe.py")
GB = 1_000_000_000


def _probe(scenario: str, tmp_path: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH")])
        ),
    }
    done = subprocess.run(
        [sys.executable, str(PROBE), scenario, str(tmp_path / "sb")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sparse_file_in_four_concurrent_rollouts_costs_the_host_no_memory(tmp_path):
    """4 rollouts at once each leave their write_file answer as a 1 GB sparse file; the shipped
    checker reads it through ``ctx.sandbox``: each scores 0 with the limit in its reason, and the
    host process's peak RSS grows by far less than one file (the unbounded reader: 4-5 GB). The
    control in the same process reads a 200 MB file whole with the limit raised above it: the
    measurement does see a whole read."""
    out = _probe("sparse_rollouts", tmp_path)
    assert [e["reward"] for e in out["warm"]] == [0.0] * 4, out["warm"]  # a 10-byte file: wrong text
    for ep in out["defended"]:
        assert ep["reward"] == 0.0, ep
        assert "max_read_bytes" in ep["reason"] and "64 MiB" in ep["reason"], ep
    assert out["growth_mb"] < 300, out
    assert out["control_growth_mb"] > 150, out  # the instrument works: a real whole read shows
    assert "holds" in out["control"][0]["reason"], out["control"]  # read whole, then judged wrong


def test_a_10gb_verifier_output_is_refused_before_it_is_read(tmp_path):
    """A verifier command that writes 10 GB to stdout (sparse, so free for the sandbox): ``exec``
    fails with the limit and how to raise it, having read none of it; the sandbox goes on."""
    out = _probe("big_output", tmp_path)
    assert out["small"] == "hello\n", out
    assert out.get("error", {}).get("type") == "FileTooLargeError", out
    message = out["error"]["message"]
    assert "stdout" in message and "max_read_bytes" in message and "64 MiB" in message, message
    assert out["growth_mb"] < 100, out
    assert out["after"].split() == ["0", "ok"], out


@pytest.fixture
async def sandbox(tmp_path):
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb")))
    sb = await factory.create("bounded")
    try:
        yield sb
    finally:
        await sb.close()
        await close_factory(factory)


async def test_every_verifier_read_of_a_sparse_file_is_refused(sandbox, tmp_path):
    await sandbox.exec(f"truncate -s {GB} big && mkdir -p d && truncate -s {GB} d/big && echo small > small")
    scratch = f"{sandbox.scratch_dir}/big"
    await sandbox.exec(f"truncate -s {GB} {scratch}")
    ctx = VerifierContext(sandbox)
    for path in ("big", f"{sandbox.workdir}/big", scratch):
        with pytest.raises(OSError, match=r"64 MiB.*max_read_bytes") as info:
            await ctx.read_file(path)
        assert "env config" in str(info.value)
        with pytest.raises(OSError, match="max_read_bytes"):
            await ctx.download_file(path, tmp_path / "out" / "big")
        assert not (tmp_path / "out" / "big").exists()
        assert await ctx.exists(path)  # exists() does not read the file
    with pytest.raises(OSError, match="max_read_bytes"):
        await ctx.sandbox.read_bytes("big")  # what the shipped checkers call
    with pytest.raises(OSError, match="max_read_bytes"):
        await ctx.download_dir("d", tmp_path / "dl")
    assert await ctx.read_file("small") == b"small\n"
    assert await ctx.sandbox.read_bytes("big", 5) == b"\0" * 5  # an explicit small limit: a prefix
    kept = await snapshot(ctx)
    assert sorted(kept["omitted"]) == ["big", "d/big"] and set(kept["files_b64"]) == {"small"}


async def test_the_limit_is_the_env_config_field(sandbox, tmp_path):
    from trajforge.envs import EnvConfig

    assert EnvConfig().max_read_bytes == 64 << 20
    await sandbox.exec(
        "head -c 1000 /dev/zero > a && head -c 1001 /dev/zero > b && mkdir d && cp a d/1 && cp a d/2"
    )
    ctx = VerifierContext(sandbox, max_read_bytes=1000)
    assert len(await ctx.read_file("a")) == 1000
    with pytest.raises(OSError, match="1001 bytes.*limit of 1000 bytes"):
        await ctx.read_file("b")
    with pytest.raises(OSError, match="stdout"):
        await ctx.exec(["cat", "b"])
    assert len((await ctx.exec(["cat", "a"])).stdout) == 1000
    with pytest.raises(OSError, match="download_dir"):  # 2000 bytes in all
        await ctx.download_dir("d", tmp_path / "dl")


class _GrowsAfterListing(VerifierContext):
    """A file that is small when ``snapshot`` lists the workdir and 200 MB (sparse) when it reads
    it: what a process left running (``stop_processes_before_reward: false``) can do."""

    async def exec(self, command: Any, **kw: Any) -> Any:
        res = await super().exec(command, **kw)
        if isinstance(command, list) and command[:1] == ["find"]:
            await self.sandbox.exec(f"truncate -s {200_000_000} grows", timeout=30)
        return res


async def test_snapshot_is_bounded_even_when_a_file_grows_after_listing(sandbox):
    await sandbox.exec("echo tiny > grows && echo keep > keep")
    kept = await snapshot(_GrowsAfterListing(sandbox))
    assert kept["omitted"] == ["grows"], kept["omitted"]
    assert set(kept["files_b64"]) == {"keep"}
    assert len(json.dumps(kept)) < 4096
    with pytest.raises(LookupError, match="too large to keep"):
        await KeptFiles(kept).read_bytes("grows")


async def test_yc_bench_keeps_a_bounded_log_and_says_it_was_cut(sandbox):
    env = YcBenchEnv()
    item = env.generate(0, split="eval")
    await sandbox.exec("mkdir -p .yc_bench && truncate -s 20000000 .yc_bench/commands.jsonl")
    kept = await env.keep(item, None, VerifierContext(sandbox))  # type: ignore[arg-type]
    assert len(json.dumps(kept)) < 2 << 20, len(json.dumps(kept))  # was a 126 MB line
    assert kept.get("log_cut"), {k: v for k, v in kept.items() if k != "log"}
    assert await env.rescore(item, [], kept) is None  # a cut log is not replayed as if whole
    await sandbox.exec(": > .yc_bench/commands.jsonl")
    whole = await env.keep(item, None, VerifierContext(sandbox))  # type: ignore[arg-type]
    assert whole == {"log": ""} and await env.rescore(item, [], whole) is not None
