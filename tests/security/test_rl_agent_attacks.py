"""The RL agent's model writes env files: none of it may run on the host.

Before this suite (commit 53e87f8), ``rl_list_environments`` copied the agent's ``envs/*.py`` into
the operator's ``--envs-dir`` and imported it on the host to list it: the model's code ran as the
host user (root, in most containers) without any training run. Now the file is kept in an agent
env store, listed from its syntax tree, and runs only in the env host's bubblewrap sandbox after
the operator approved exactly that content. Each attack below is also shown working without the
defence (a control), so a pass means the defence held, not that the attack was a dud.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from envhost_attacks import run as run_attacks

import trajforge
from trajforge.envs import EnvConfigError, RolloutBackends, UnknownEnvError, env_class, load_env, run_eval
from trajforge.envs.sandboxed.host import EnvHostError
from trajforge.envs.sandboxed.store import AgentEnvNotApproved, AgentEnvStore
from trajforge.rl.agent import RLAgent, RLAgentConfig
from trajforge.rl.runs.manager import Manager
from trajforge.rl.runs.tools import AgentEnvReview, RLToolSettings
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
HERE = Path(__file__).parent


def _approved(tmp_path: Path, source: str, cls: str, name: str = "env") -> str:
    store = AgentEnvStore(tmp_path / "agent_envs")
    version = store.ingest(name, source.encode(), source="test")
    store.approve(version.name, version.sha256, by="test")
    return str(version.ref(cls))


# ---------------------------------------------------------------------------------------- attacks


def _check_attacks(report: dict[str, Any]) -> None:
    control, boxed = report["control"], report["sandboxed"]
    # the control: every attack works when the code runs on the host
    for name in ("read_host_secret", "write_host_canary", "connect_host_loopback", "signal_host_process"):
        assert control[name]["ok"], (name, control[name])
    assert report["secret"] in control["read_host_secret"]["value"]
    assert report["accepted_by_control"] == 1
    # in the env host: none does
    for name in (
        "read_host_secret",
        "read_etc_shadow",
        "write_host_canary",
        "write_trajforge_source",
        "connect_host_loopback",
        "signal_host_process",
    ):
        assert not boxed[name]["ok"], (name, boxed[name])
    assert report["secret"] not in json.dumps(boxed)
    assert report["accepted_from_sandbox"] == 0 and not report["canary_exists"] and not report["probe_exists"]
    # beside trajforge (a checkout's other files, or site-packages) only what the env host needs
    beside = Path(trajforge.__file__).resolve().parents[2]
    if boxed["read_beside_trajforge"]["ok"] and not beside.is_relative_to(Path(sys.prefix).resolve()):
        # the package's own directory, and the Python install when it lives in the checkout
        # (a ``.venv`` beside ``src``, as ``make setup`` makes one): the env host needs both
        needed = {Path(trajforge.__file__).resolve().parents[1].name}
        for prefix in (sys.prefix, sys.base_prefix):
            real = Path(prefix).resolve()
            if real.is_relative_to(beside) and real != beside:
                needed.add(real.relative_to(beside).parts[0])
        assert boxed["read_beside_trajforge"]["value"] == repr(sorted(needed))
        assert control["read_beside_trajforge"]["value"] != boxed["read_beside_trajforge"]["value"]
    # the host's home shows nothing but the Python install the env host needs, if that lives there
    if boxed["list_host_home"]["ok"]:
        assert boxed["list_host_home"]["value"] in ("[]", "['.pyenv']", "['.local']")
    # its own run directory is writable: the sandbox is usable, not merely broken
    assert boxed["write_own_run_dir"]["ok"] and "/run/env/" in boxed["write_own_run_dir"]["value"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the root set-up: the env host gets a uid of its own")
def test_an_approved_agent_env_cannot_reach_the_host_as_root(tmp_path: Path) -> None:
    report = run_attacks(tmp_path)
    _check_attacks(report)
    uid = int(report["sandboxed"]["uid"]["value"])
    assert uid != 0 and report["sandboxed"]["subprocess_id"]["value"] == repr(str(uid))


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the scenario as nobody through setpriv")
def test_an_approved_agent_env_cannot_reach_the_host_as_an_unprivileged_user() -> None:
    """As ``nobody`` bwrap makes a user namespace: the same attacks, the same outcome."""
    if shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs setpriv and /usr/bin/python3 to run as an unprivileged user")
    work = Path(tempfile.mkdtemp(prefix="tf-envhost-nobody-"))
    os.chmod(work, 0o777)
    paths = [str(HERE), str(Path(trajforge.__file__).parents[1])]
    paths += [p for p in sys.path if p.endswith("site-packages")]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "PYTHONPATH": os.pathsep.join(paths),
        "TMPDIR": str(work),
    }
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
    probe = subprocess.run([*cmd, "-c", "import trajforge.envs, pydantic"], env=env, capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"the system python3 cannot import this checkout as nobody: {probe.stderr[-200:]!r}")
    try:
        done = subprocess.run(
            [*cmd, str(HERE / "envhost_attacks.py"), str(work)],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert report["host_uid"] == 65534
    _check_attacks(report)


# ---------------------------------------------------------------------------------------- the agent

CANARY_ENV = '''
"""An env whose import writes a canary: the proof that something imported it."""
import pathlib

try:
    pathlib.Path({canary!r}).write_text("imported")
except OSError:
    pass  # in the env host the host's path is not there: the env loads anyway

from trajforge.envs import BaseEnv


class CanaryEnv(BaseEnv):
    name = "canary"
    description = "looks harmless"

    def generate(self, index, *, split):
        return {{"id": str(index), "prompt": "say hi"}}

    async def compute_reward(self, item, result, ctx):
        return 1.0
'''


def _plain_import(path: Path) -> None:
    """The control: what importing the file on the host (the old listing) does."""
    subprocess.run(
        [sys.executable, "-c", f"import runpy; runpy.run_path({str(path)!r})"],
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )


def _agent_policy(steps: list[tuple[str, dict[str, Any]]]) -> Any:
    script: list[Any] = [tool_turn((name, args)) for name, args in steps]
    return ScriptedModel([*script, answer("done")])


def _outputs(result: Any) -> list[tuple[str, str]]:
    names = {
        tc["id"]: tc["function"]["name"]
        for m in result.messages
        if m["role"] == "assistant"
        for tc in m.get("tool_calls") or []
    }
    return [(names[m["tool_call_id"]], str(m["content"])) for m in result.messages if m["role"] == "tool"]


async def _run_agent(tmp_path: Path, steps: list[tuple[str, dict[str, Any]]], **settings: Any) -> Any:
    approver = settings.pop("approver", None)
    tool_settings = RLToolSettings(
        envs_dir=tmp_path / "envs",
        agent_envs_dir=tmp_path / "agent_envs",
        inference_dir=tmp_path / "inf",
        **settings,
    )
    config = RLAgentConfig(toolsets=["file", "rl"], max_iterations=len(steps) + 1)
    async with RLAgent(
        _agent_policy(steps), Manager(tmp_path / "runs"), tool_settings, config, approver=approver
    ) as agent:
        return await agent.ask("make an env")


async def test_listing_an_agent_written_env_does_not_run_it(tmp_path: Path) -> None:
    """The finding as reported: the model writes envs/x.py, calls rl_list_environments, and the
    host imports it (at 53e87f8: "AssertionError: imported as uid 0")."""
    canary = tmp_path / "canary.txt"
    source = CANARY_ENV.format(canary=str(canary)).replace('"imported"', 'f"imported as uid {os.getuid()}"')
    source = "import os\n" + source
    await _run_agent(
        tmp_path, [("write_file", {"path": "envs/x.py", "content": source}), ("rl_list_environments", {})]
    )
    assert not canary.exists(), canary.read_text()


async def test_listing_and_selecting_an_unapproved_agent_env_runs_none_of_it(tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    source = CANARY_ENV.format(canary=str(canary))
    store_file_glob = "canary_env.*.py"
    steps = [
        ("write_file", {"path": "envs/canary_env.py", "content": source}),
        ("rl_list_environments", {}),
        ("rl_select_environment", {"name": "agent/canary_env"}),
        ("rl_start_training", {}),
        ("rl_test_inference", {}),
        ("rl_select_environment", {"name": "canary_env"}),  # not an operator env of that name
        ("rl_select_environment", {"name": "antigravity:x"}),  # no arbitrary module imports
    ]
    stored = tmp_path / "agent_envs"
    steps.append(("rl_select_environment", {"name": f"{stored}/canary_env.0.py:CanaryEnv"}))
    result = await _run_agent(tmp_path, steps)
    out = _outputs(result)
    listing = json.loads(out[1][1])
    row = next(e for e in listing["environments"] if e["source"] == "agent")
    assert row["name"] == "agent/canary_env" and row["approved"] is False
    assert row["description"] == "looks harmless" and "proof" in row["doc"]
    assert listing["copied_from_sandbox"] == ["agent/canary_env"]
    assert not (tmp_path / "envs").exists()  # never the operator's directory
    select, train, test, bare, module, path = (o for _, o in out[2:])
    assert select.startswith("Error: agent/canary_env:CanaryEnv was written by the RL agent") and (
        "nothing of it ran" in select
    )
    assert "no environment selected" in train and "no environment selected" in test
    assert bare.startswith("Error: unknown env 'canary_env'") and module.startswith("Error: unknown env")
    assert path.startswith("Error: unknown env")
    assert not canary.exists()

    # The copy in the store: a plain import runs it (the control) -- the catalog refuses to.
    copy = next(stored.glob(store_file_glob))
    with pytest.raises(UnknownEnvError, match="written by an RL agent"):
        env_class(f"{copy}:CanaryEnv")
    with pytest.raises(AgentEnvNotApproved):
        load_env(f"agent-env:{copy}:CanaryEnv")
    assert not canary.exists()
    await asyncio.to_thread(_plain_import, copy)
    assert canary.read_text() == "imported"


async def test_the_operator_approves_in_the_repl_and_the_env_runs_sandboxed(tmp_path: Path) -> None:
    """The REPL's question: "no" runs nothing; "yes" runs it -- in its env host, where its import
    cannot write the host's canary. An approval holds for that content only."""
    canary = tmp_path / "canary.txt"
    source = CANARY_ENV.format(canary=str(canary))
    asked: list[AgentEnvReview] = []
    answers = iter([False, True])

    async def operator(review: AgentEnvReview) -> bool:
        asked.append(review)
        return next(answers)

    steps = [
        ("write_file", {"path": "envs/canary_env.py", "content": source}),
        ("rl_list_environments", {}),
        ("rl_select_environment", {"name": "agent/canary_env"}),
        ("rl_select_environment", {"name": "agent/canary_env"}),
        ("rl_select_environment", {"name": "agent/canary_env"}),  # approved now: no question
        ("write_file", {"path": "envs/canary_env.py", "content": source + "\n# changed\n"}),
        ("rl_list_environments", {}),
        ("rl_edit_config", {"field": "max_agent_turns", "value": 3}),  # runs the selected, approved content
        ("rl_select_environment", {"name": "agent/canary_env"}),  # new content: asked again (iter ends)
    ]
    answers = iter([False, True, False])
    result = await _run_agent(tmp_path, steps, approver=operator)
    out = [o for _, o in _outputs(result)]
    assert "not approved" in out[2] and "nothing of it ran" in out[2]
    first = json.loads(out[3])
    assert first["selected"] == "agent/canary_env:CanaryEnv" and first["example_prompt"] == "say hi"
    assert json.loads(out[4])["selected"] == "agent/canary_env:CanaryEnv"
    assert len(asked) == 3 and asked[0].sha256 == asked[1].sha256 != asked[2].sha256
    assert asked[0].path.read_text() == source and asked[0].classes[0]["class"] == "CanaryEnv"
    assert json.loads(out[7])["changed"] == {"max_agent_turns": 3}
    assert "not approved" in out[8]
    assert not canary.exists()  # the env ran, in its sandbox: the import's write did not reach the host


# ---------------------------------------------------------------------------------------- end to end

REWARD_ENV = """
from trajforge.envs import BaseEnv, RewardBreakdown


class WordEnv(BaseEnv):
    name = "word_file"
    description = "write the item's word into answer.txt"

    def generate(self, index, *, split):
        return {"id": f"{split}-{index}", "prompt": f"Write w{index} into answer.txt", "word": f"w{index}"}

    def setup_files(self, item):
        return {"notes.txt": "hello", "blob.bin": bytes([0, 255, 1])}

    def verifier_files(self, item):
        return {"expected.txt": item["word"]}

    def category(self, item):
        return "even" if int(item["word"][1:]) % 2 == 0 else "odd"

    async def compute_reward(self, item, result, ctx):
        res = await ctx.exec(["cat", "answer.txt"])
        got = res.stdout.decode().strip()
        expected = (await ctx.read_file("expected.txt")).decode()
        blob = await ctx.sandbox.read_bytes("blob.bin")
        hits = await ctx.search(expected, ".", fixed=True)
        missing = await ctx.exists("no-such-file")
        await ctx.write_file("judged.txt", "yes")
        judged = (await ctx.exec("cat judged.txt")).text
        term = await ctx.terminal("cat answer.txt; exit 4", timeout=30)  # the seed's verb, via the host
        return RewardBreakdown(
            reward=1.0 if got == expected else 0.0,
            components={"blob": float(blob == bytes([0, 255, 1])), "hits": float(len(hits)),
                        "missing": float(missing), "judged": float(judged == "yes"),
                        "terminal": float(term["exit_code"] == 4 and term["output"].strip() == got)},
            reason=f"answer {got!r}, final {result.final_answer!r}",
        )

    async def keep(self, item, result, ctx):
        return {"answer": (await ctx.read_file("answer.txt")).decode()}

    async def rescore(self, item, messages, kept):
        return 1.0 if kept.get("answer", "").strip() == item["word"] else 0.0
"""


def _word_solver(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    word = prompt.split()[1]
    if not any(m["role"] == "tool" for m in messages):
        right = int(word[1:]) % 2 == 0  # solves the even items only
        return tool_turn(("write_file", {"path": "answer.txt", "content": word if right else "nope"}))
    return answer("written")


async def test_an_approved_agent_env_is_evaluated_through_its_env_host(tmp_path: Path) -> None:
    """``env eval``'s runner over an agent env: items, prompts, setup and verifier files come from
    the env host; its reward code judges each rollout's own bwrap sandbox through the host."""
    ref = _approved(tmp_path, REWARD_ENV, "WordEnv")
    env: Any = load_env(ref, {"max_agent_turns": 3})
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    registry = default_registry()
    try:
        backends = RolloutBackends(ScriptedModel(_word_solver), factory, registry)
        run = await run_eval(env, backends, tmp_path / "run", n=4, group_size=1)
        episodes = sorted(
            (json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()),
            key=lambda e: e["item_id"],
        )
        rescored = [await env.rescore(e["item"], e["messages"], e["reward"]["kept"]) for e in episodes]
    finally:
        await close_factory(factory)
        await registry.aclose()
        await env.aclose()
    assert env.name == "agent/word_file" and env.config.max_agent_turns == 3
    assert [e["item_id"] for e in episodes] == ["eval-0", "eval-1", "eval-2", "eval-3"]
    assert [e["status"] for e in episodes] == ["completed"] * 4
    assert [e["reward"]["value"] for e in episodes] == [1.0, 0.0, 1.0, 0.0]
    assert [e["category"] for e in episodes] == ["even", "odd", "even", "odd"]
    for e in episodes:
        assert e["reward"]["error"] is None and e["env"] == "agent/word_file"
        hits = 2.0 if e["reward"]["value"] else 1.0  # the word in expected.txt, and in answer.txt when solved
        assert e["reward"]["components"] == {
            "blob": 1.0,
            "hits": hits,
            "missing": 0.0,
            "judged": 1.0,
            "terminal": 1.0,
        }
        assert e["reward"]["reason"].endswith("final 'written'")
    assert [e["reward"]["kept"]["answer"] for e in episodes] == ["w0", "nope", "w2", "nope"]
    assert [r.reward for r in rescored] == [1.0, 0.0, 1.0, 0.0]
    assert run.summary.pass_at_1.value == 0.5


HANGING_ENV = """
import asyncio, os
from trajforge.envs import BaseEnv


class Hangs(BaseEnv):
    name = "hangs"

    def generate(self, index, *, split):
        return {"id": str(index), "prompt": "go", "mode": ["hang", "ok", "die"][index % 3]}

    async def compute_reward(self, item, result, ctx):
        if item["mode"] == "hang":
            await asyncio.sleep(3600)
        if item["mode"] == "die":
            os._exit(3)
        return 1.0
"""


async def test_a_hanging_reward_times_out_and_a_dying_env_host_fails_episodes_not_scores(
    tmp_path: Path,
) -> None:
    ref = _approved(tmp_path, HANGING_ENV, "Hangs")
    env: Any = load_env(ref, {"reward_timeout_s": 2, "max_concurrent_rollouts": 1, "max_agent_turns": 1})
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    registry = default_registry()
    try:
        await run_eval(
            env,
            RolloutBackends(ScriptedModel(["fine"] * 10), factory, registry),
            tmp_path / "r",
            n=3,
            group_size=1,
        )
    finally:
        await close_factory(factory)
        await registry.aclose()
        await env.aclose()
    episodes = {
        e["item"]["mode"]: e
        for e in (json.loads(line) for line in (tmp_path / "r" / "episodes.jsonl").read_text().splitlines())
    }
    assert (
        episodes["hang"]["reward"]["value"] == 0.0 and "TimeoutError" in episodes["hang"]["reward"]["error"]
    )
    assert episodes["ok"]["reward"]["value"] == 1.0  # the env host kept serving after a cancelled reward
    assert episodes["die"]["status"] == "failed" and "env host exited" in episodes["die"]["reason"]


BROKEN_WIRE_ENV = """
import os
# write a forged, invalid answer onto every pipe this process holds, before the real init answer
for fd in range(3, 64):
    try:
        if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
            os.write(fd, b'{"id": 1, "ok": true, "value": NaN}\\n')
    except OSError:
        pass
from trajforge.envs import BaseEnv


class Forger(BaseEnv):
    name = "forger"

    async def compute_reward(self, item, result, ctx):
        return 1.0
"""


def test_an_env_host_that_breaks_the_wire_is_stopped_and_nothing_it_sent_is_used(tmp_path: Path) -> None:
    ref = _approved(tmp_path, BROKEN_WIRE_ENV, "Forger")
    with pytest.raises(EnvHostError, match="broke the protocol"):
        load_env(ref)


def test_an_agent_env_may_not_choose_an_unisolated_sandbox(tmp_path: Path) -> None:
    source = textwrap.dedent(
        """
        from trajforge.envs import BaseEnv, EnvConfig

        class Local(BaseEnv):
            name = "local"

            @classmethod
            def default_config(cls):
                return EnvConfig(sandbox="local")

            async def compute_reward(self, item, result, ctx):
                return 1.0
        """
    )
    with pytest.raises(EnvConfigError, match="run isolated"):
        load_env(_approved(tmp_path, source, "Local"))


LINGERING_ENV = """
import subprocess
from trajforge.envs import BaseEnv

# a process the env leaves behind, marked so the test can look for it on the host
subprocess.Popen(["sleep", "{marker}"])


class Lingers(BaseEnv):
    name = "lingers"

    def generate(self, index, *, split):
        return {{"id": str(index), "prompt": "x"}}

    async def compute_reward(self, item, result, ctx):
        return 0.0
"""


def _marked(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_the_env_host_and_what_it_started_die_with_its_parent(tmp_path: Path) -> None:
    """``kill -9`` of the process that started an env host takes the env host and every process
    it started along (bwrap --die-with-parent, its own pid namespace)."""
    marker = f"1000.{os.getpid()}{len(str(tmp_path))}7"
    ref = _approved(tmp_path, LINGERING_ENV.format(marker=marker), "Lingers")
    script = (
        "import sys, time; from trajforge.envs import load_env; "
        f"env = load_env({ref!r}); env.eval_items(1); print('up', flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "up"
        assert _marked(marker), "the env's process runs while its parent does"
        parent.kill()
        parent.wait()
        for _ in range(300):  # observed state, not a wall-time assertion: up to 30 s for the kernel
            if not _marked(marker):
                break
            time.sleep(0.1)
        assert _marked(marker) == []
    finally:
        parent.kill()


@pytest.mark.parametrize(
    "line",
    [
        b'{"id": 1, "ok": true, "value": NaN}\n',
        b'{"id": 1, "ok": true, "value": Infinity}\n',
        b'{"id": 1, "ok": true, "value": 1e999}\n',
        b'{"id": 1, "ok": true, "value": ' + b"9" * 5000 + b"}\n",
        b"[1, 2]\n",
        b'{"id": 1}',  # cut short: no end of line
        b"\x80\x81\n",
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
    ],
    ids=["nan", "infinity", "1e999", "huge-int", "not-an-object", "no-newline", "not-utf8", "deep"],
)
def test_the_wire_takes_bounded_json_objects_of_finite_numbers_only(line: bytes) -> None:
    from trajforge.envs.sandboxed.wire import WireError, decode, encode, unblob

    with pytest.raises(WireError):
        decode(line)
    with pytest.raises(WireError):
        encode({"reward": float("inf")})
    with pytest.raises(WireError):
        unblob({"b64": "not base64!"})
    assert decode(encode({"text": "a\udcff\u00e9", "n": [1, 2.5]})) == {
        "text": "a\udcff\u00e9",
        "n": [1, 2.5],
    }
