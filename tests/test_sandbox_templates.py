"""Forkable sandboxes: a template prepared once, children started from it, each apart from its
siblings and from the template (overlay as root, a copy otherwise)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest

from trajforge.agent import AgentResult
from trajforge.envs import BaseEnv, RolloutBackends, Rollouts
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.envs.verifier import VerifierContext
from trajforge.sandbox import SandboxConfig, create_sandbox_factory
from trajforge.sandbox import factory as factory_module
from trajforge.sandbox.templates import ForkingFactory, TemplateGone, key_filter
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

SETUP = (
    "mkdir -p repo/pkg && echo base > repo/keep && echo lib > repo/pkg/lib.py && chmod 644 repo/keep "
    "&& ln -s keep repo/link && echo ok"
)


async def _setup(sb: Any) -> None:
    res = await sb.exec(SETUP)
    assert res.output == "ok\n", res


def _mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _factory(tmp_path: Path, **kw: Any):
    return create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb"), **kw))


@pytest.fixture(params=["overlay", "copy"])
def mode(request, monkeypatch):
    if request.param == "overlay" and os.geteuid() != 0:
        pytest.skip("overlay children need root")
    if request.param == "copy":
        monkeypatch.setattr(factory_module, "can_overlay", lambda: False)
    return request.param


async def test_children_are_apart_from_their_siblings_and_the_template(tmp_path, mode):
    """A child's writes, chmod, deletes, renames and file-tool writes stay its own: the template's
    frozen files and a sibling see none of it; each child starts with exactly the template's."""
    async with _factory(tmp_path) as factory:
        template = await factory.template("repo", setup=_setup)
        assert template.overlay == (mode == "overlay")
        a, b = [await factory.create(f"child-{i}", template=template) for i in range(2)]
        changed = await a.exec(
            "cd repo && echo changed > keep && chmod 600 pkg/lib.py && rm link && mv pkg moved "
            "&& echo new > new.txt && echo ok"
        )
        assert changed.output == "ok\n", changed
        await a.write_bytes("repo/tool.txt", b"tool")
        seen = await b.exec("cd repo && cat keep && stat -c %a pkg/lib.py && readlink link && ls")
        assert seen.output == "base\n644\nkeep\nkeep\nlink\npkg\n", seen
        lower = template.lower / "repo"
        assert (lower / "keep").read_text() == "base\n"
        assert oct((lower / "pkg" / "lib.py").stat().st_mode & 0o777) == "0o644"
        assert sorted(os.listdir(lower)) == ["keep", "link", "pkg"]
        assert await a.read_bytes("repo/keep") == b"changed\n"
        assert await b.read_bytes("repo/keep") == b"base\n"
        await a.close()
        c = await factory.create("child-c", template=template)  # after a sibling is gone
        assert (await c.exec("cat repo/keep; ls repo")).output == "base\nkeep\nlink\npkg\n"
        await asyncio.gather(b.close(), c.close())
        counts = factory.stats.counts()
        assert counts["templates"] == 1 and counts["forked"] == 3, counts
        root = template.root
    assert not root.exists()  # the factory's close removed the template
    assert str(tmp_path) not in _mounts()  # no overlay or tmpfs left mounted


async def test_a_template_is_prepared_once_per_key(tmp_path):
    calls: list[str] = []

    async def setup(sb: Any) -> None:
        calls.append("setup")
        await sb.exec("echo prepared > state")

    async with _factory(tmp_path) as factory:
        t1, t2 = await asyncio.gather(factory.template("k", setup=setup), factory.template("k", setup=setup))
        assert t1 is t2 and calls == ["setup"]
        other = await factory.template("other", setup=setup)
        assert other is not t1 and calls == ["setup", "setup"]


async def test_a_failing_setup_leaves_no_template(tmp_path):
    async def broken(sb: Any) -> None:
        raise RuntimeError("setup broke")

    async with _factory(tmp_path) as factory:
        with pytest.raises(RuntimeError, match="setup broke"):
            await factory.template("k", setup=broken)
        assert factory._templates == {} and os.listdir(tmp_path / "sb") == []
        template = await factory.template("k", setup=_setup)  # the next call prepares it again
        child = await factory.create("c", template=template)
        assert (await child.exec("cat repo/keep")).output == "base\n"
        await child.close()


async def test_templates_are_evicted_least_recently_used_and_never_under_a_child(tmp_path):
    async with _factory(tmp_path) as factory:
        factory.max_templates = 1
        first = await factory.template("first", setup=_setup)
        child = await factory.create("c", template=first)
        second = await factory.template("second", setup=_setup)  # the first has a child: kept
        assert set(factory._templates) == {"first", "second"}
        await child.close()
        await factory.template("third", setup=_setup)  # now the first (then the second) can go
        assert set(factory._templates) == {"third"} and first.removed and second.removed
        assert not first.root.exists()
        with pytest.raises(TemplateGone):
            await factory.create("late", template=first)


@pytest.mark.skipif(os.geteuid() != 0 or key_filter() is None, reason="uids of their own only as root")
async def test_a_templates_sandboxes_share_its_uid_and_get_no_kernel_keys(tmp_path):
    """As root every sandbox has a uid of its own; a template's children share the template's
    (their files are its). The kernel keeps a user keyring per uid, so key system calls are
    refused for them; an ordinary sandbox still has them (the control)."""
    keyctl = "python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); r=l.syscall(250, 0, -4, 0); print(r, ctypes.get_errno())'"
    if os.uname().machine == "aarch64":
        keyctl = keyctl.replace("250", "219")
    async with _factory(tmp_path) as factory:
        template = await factory.template("k", setup=_setup)
        a, b = [await factory.create(f"c{i}", template=template) for i in range(2)]
        ids = [(await sb.exec("id -u")).output for sb in (a, b)]
        assert ids[0] == ids[1] == f"{template.owner[0]}\n"
        assert (await a.exec(keyctl)).output == "-1 1\n"  # EPERM
        plain = await factory.create("plain")
        assert (await plain.exec("id -u")).output != ids[0]
        assert not (await plain.exec(keyctl)).output.startswith("-1 1")
        await asyncio.gather(a.close(), b.close(), plain.close())


async def test_the_forking_factory_templates_a_shared_cwd(tmp_path):
    """``batch --samples-per-prompt``: samples of one row with a ``cwd`` fork from one template of
    that directory; the directory is copied once, not per sample."""
    source = tmp_path / "task"
    (source / "src").mkdir(parents=True)
    (source / "src" / "main.py").write_text("print('hi')\n")
    async with _factory(tmp_path, reuse=True) as inner:
        factory = ForkingFactory(inner)
        boxes = [await factory.create(f"s{i}", cwd=str(source)) for i in range(3)]
        (source / "src" / "main.py").write_text("changed on the host\n")  # after the template
        outs = [(await sb.exec("cat src/main.py; echo x >> src/main.py")).output for sb in boxes]
        assert outs == ["print('hi')\n"] * 3
        plain = await factory.create("no-cwd")
        assert (await plain.exec("ls -A")).output == ""
        for sb in [*boxes, plain]:
            await sb.close()
        counts = inner.stats.counts()
        assert counts["templates"] == 1 and counts["forked"] == 3 and counts["created"] == 1, counts


class _RepoEnv(BaseEnv):
    """Each item's start is a prepared repository (``prepare_sandbox``), shared by every rollout of
    the item (``template_key``)."""

    name: ClassVar[str] = "repo"
    description: ClassVar[str] = "test env"
    prepared: ClassVar[list[str]] = []

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": f"r{index}", "prompt": "look"}

    def template_key(self, item: Item) -> str:
        return str(item["id"])

    async def prepare_sandbox(self, item: Item, sandbox: Any) -> None:
        self.prepared.append(str(item["id"]))
        await sandbox.exec(f"mkdir -p repo && echo {item['id']} > repo/id")

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        seen = await ctx.exec(["cat", "repo/id", "repo/mine"])
        return RewardBreakdown(reward=1.0 if seen.text.split()[0] == item["id"] else 0.0, reason=seen.text)


def _look(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    if len(messages) <= 2:
        return tool_turn(("terminal", {"command": "cat repo/id; echo $RANDOM > repo/mine"}))
    return answer("done")


async def test_a_grpo_group_of_a_templated_env_prepares_once_and_forks(tmp_path):
    env = _RepoEnv()
    _RepoEnv.prepared.clear()
    async with _factory(tmp_path, reuse=True) as factory:
        rollouts = Rollouts(env, RolloutBackends(ScriptedModel(_look), factory, default_registry()))
        item = env.generate(0, split="train")
        group = await rollouts.group(item, 4)
        assert [e.status for e in group] == ["completed"] * 4
        assert [e.reward.value for e in group] == [1.0] * 4, [e.reward.reason for e in group]
        mine = {e.reward.reason.split()[1] for e in group}
        assert len(mine) == 4  # each rollout saw only its own write
        assert _RepoEnv.prepared == ["r0"]
        counts = factory.stats.counts()
        assert counts["templates"] == 1 and counts["forked"] == 4, counts
