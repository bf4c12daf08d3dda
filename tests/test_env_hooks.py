"""The optional env hooks (``envs/hooks.py``): each one declared, documented for env authors, found
through its accessor everywhere (never a bare ``getattr``), with one rule for an env whose hook is
absent or ``None`` -- also an instance's ``self.hook = None`` over a class's method, which Python
3.11's protocol ``isinstance`` alone would take for a hook."""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typing_extensions import get_protocol_members

from trajforge.agent.result import AgentResult
from trajforge.engine.summary import summarize
from trajforge.envs import (
    BaseEnv,
    EnvConfig,
    EvalRun,
    Item,
    RolloutBackends,
    Rollouts,
    VerifierContext,
    hooks,
    run_eval,
)
from trajforge.envs.agents import agent_model_for
from trajforge.envs.running.backends import env_registry
from trajforge.envs.running.episode import _prepared, _PreparingFactory, env_sandbox_config
from trajforge.envs.sandboxed.child import _Server
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.scripted_model import ScriptedModel
from trajforge.tools.builtin import default_registry
from trajforge.tools.registry import ToolRegistry

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "trajforge"
NOT_YET: set[Path] = set()  # files whose hook lookups wait for a change in flight (none now)

PROTOCOLS = [
    obj
    for name in hooks.__all__
    if inspect.isclass(obj := getattr(hooks, name)) and getattr(obj, "_is_protocol", False)
]


def _members(proto: type) -> set[str]:
    return set(get_protocol_members(proto))


# ---------------------------------------------------------------------------- declared, documented, used


def test_every_hook_is_one_runtime_checkable_protocol_with_a_docstring() -> None:
    assert len(PROTOCOLS) >= 20
    seen: set[str] = set()
    for proto in PROTOCOLS:
        assert getattr(proto, "_is_runtime_protocol", False), proto.__name__
        (member,) = _members(proto)  # one hook each
        assert member not in seen
        seen.add(member)
        doc = inspect.getdoc(getattr(proto, member))
        assert doc and len(doc) > 40, f"{proto.__name__}.{member} needs a docstring saying when it is called"


def test_every_hook_is_documented_for_env_authors() -> None:
    text = (ROOT / "docs" / "envs.md").read_text()
    section = text.split("## Optional hooks", 1)
    assert len(section) == 2, "docs/envs.md has no '## Optional hooks' section"
    body = section[1].split("\n## ", 1)[0]
    missing = [
        f"{p.__name__} ({m})"
        for p in PROTOCOLS
        for m in _members(p)
        if f"`{p.__name__}`" not in body or not re.search(rf"`[^`]*\b{m}\b[^`]*`", body)
    ]
    assert not missing, f"document these hooks in docs/envs.md's 'Optional hooks': {missing}"


def _hook_lookups(text: str) -> list[tuple[int, str]]:
    """Lines of ``text`` that read an env hook with ``getattr``: on an env variable, or any hook's
    name on anything (``aclose``, ``name`` and ``description`` only on an env: models, tools and
    classes have them too)."""
    generic = {"aclose", "name", "description"}
    names = sorted(m for p in PROTOCOLS for m in _members(p) if m not in generic)
    on_env = re.compile(r"getattr\(\s*(env|self\.env|self\._env|self\.inner|instance)\s*,\s*[\"']")
    any_hook = re.compile(r"getattr\([^()]*,\s*[\"'](" + "|".join(names) + r")[\"']")
    return [
        (n, line.strip())
        for n, line in enumerate(text.splitlines(), 1)
        if on_env.search(line) or any_hook.search(line)
    ]


def test_no_getattr_hook_lookup_is_left_in_src() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line}"
        for path in sorted(SRC.rglob("*.py"))
        if path not in NOT_YET
        for n, line in _hook_lookups(path.read_text())
    ]
    assert not found, "use the accessors of trajforge.envs.hooks:\n" + "\n".join(found)


def test_the_scan_sees_the_lookups_it_replaced() -> None:
    """The scan is not vacuous: each form the accessors replaced is caught."""
    old = """
    custom = getattr(env, "oracle_model_for", None)
        system = getattr(self.env, "system_prompt", None)
            "setup_files": files_out(getattr(env, "setup_files", lambda _i: {})(item)),
        keep = getattr(self._env, "keep", None)
        inner = getattr(self.inner, "system_prompt", None)
    if where is not None and getattr(instance, "evaluates_itself", lambda: False)():
    close = getattr(env, "aclose", None)
    name = str(getattr(env, "name", ref))
    if getattr(trainer_env, "scores_tokens", False):
"""
    assert len(_hook_lookups(old)) == 9
    assert not _hook_lookups('closer = getattr(model, "aclose", None)\nx = getattr(cls, "name", ref)')


# ---------------------------------------------------------------------------- the accessors


class Bare:
    """An env without any optional hook (an agent-written class, not a BaseEnv)."""

    config = EnvConfig()


class Full(BaseEnv):
    name: ClassVar[str] = "full"
    description: ClassVar[str] = "has every hook"
    scores_tokens: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def system_prompt(self) -> str | None:
        return "sys"

    def sandbox_config(self, base: SandboxConfig) -> SandboxConfig:
        return base.model_copy(update={"command_timeout_s": 123.0})

    async def prepare_sandbox(self, item: Item, sandbox: Any) -> None:
        self.calls.append("prepare")

    def sandbox_image(self, item: Item) -> str | None:
        return f"img-{item['id']}"

    def template_key(self, item: Item) -> str | None:
        return "k"

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        return [("terminal", {"command": f"echo {item['id']}"})]

    def oracle_answer(self, item: Item, messages: list[dict[str, Any]]) -> str:
        return f"answer {item['id']}"

    def oracle_reasoning(self, item: Item, messages: list[dict[str, Any]]) -> str | None:
        return "thinking"

    def oracle_model_for(self) -> Any:
        return None  # not callable: the oracle_* hooks make the oracle

    def tool_registry(self) -> ToolRegistry:
        self.calls.append("registry")
        return default_registry()

    async def run_evaluation(self, backends: Any, run_dir: Path, **kw: Any) -> EvalRun:
        self.calls.append(f"run_evaluation n={kw['n']} g={kw['group_size']} agent={kw['agent']}")
        return EvalRun(summary=summarize([], "full"), run_dir=run_dir, ran=0)

    def evaluates_itself(self) -> bool:
        return True

    def notes(self) -> list[str]:
        return ["a note"]

    async def aclose(self) -> None:
        self.calls.append("aclose")


ACCESSORS = {
    "system_prompt": hooks.system_prompt_hook,
    "sandbox_config": hooks.sandbox_config_hook,
    "prepare_sandbox": hooks.prepare_sandbox_hook,
    "sandbox_image": hooks.sandbox_image_hook,
    "template_key": hooks.template_key_hook,
    "oracle_calls": hooks.oracle_calls_hook,
    "oracle_answer": hooks.oracle_answer_hook,
    "oracle_reasoning": hooks.oracle_reasoning_hook,
    "oracle_model_for": hooks.oracle_model_for_hook,
    "tool_registry": hooks.tool_registry_hook,
    "run_evaluation": hooks.run_evaluation_hook,
    "notes": hooks.notes_hook,
    "aclose": hooks.aclose_hook,
    "setup_files": hooks.setup_files_hook,
    "verifier_files": hooks.verifier_files_hook,
    "category": hooks.category_hook,
    "keep": hooks.keep_hook,
    "rescore": hooks.rescore_hook,
}
VALUES = {"evaluates_itself", "scores_tokens", "name", "description"}  # accessors that answer a value


def test_every_hook_has_an_accessor() -> None:
    assert {m for p in PROTOCOLS for m in _members(p)} == set(ACCESSORS) | VALUES


@pytest.mark.parametrize("hook", sorted(ACCESSORS))
def test_an_env_with_the_hook_gets_it_bound(hook: str) -> None:
    env = Full()
    found = ACCESSORS[hook](env)
    assert found is not None
    assert found == getattr(env, hook)  # the env's own bound method, nothing wrapped


@pytest.mark.parametrize("hook", sorted(ACCESSORS))
def test_an_env_without_the_hook_has_none(hook: str) -> None:
    assert ACCESSORS[hook](Bare()) is None


@pytest.mark.parametrize("hook", sorted(ACCESSORS))
def test_a_hook_set_to_none_is_no_hook(hook: str) -> None:
    on_class = type("NoneOnClass", (Full,), {hook: None})()
    assert ACCESSORS[hook](on_class) is None
    on_instance = Full()
    setattr(on_instance, hook, None)
    if sys.version_info < (3, 12):  # the class still has the method: a bare isinstance says yes
        assert isinstance(on_instance, next(p for p in PROTOCOLS if hook in _members(p)))
    assert ACCESSORS[hook](on_instance) is None


CALLABLE_CHECKED = {
    "system_prompt",
    "sandbox_config",
    "oracle_calls",
    "oracle_answer",
    "oracle_reasoning",
    "oracle_model_for",
    "tool_registry",
    "notes",
    "category",
}


@pytest.mark.parametrize("hook", sorted(ACCESSORS))
def test_a_value_that_is_not_callable_keeps_each_sites_old_rule(hook: str) -> None:
    """Where the lookup was ``callable(getattr(...))`` a non-callable value is no hook; where it
    was ``is not None`` the value is handed on and fails loudly where it is called."""
    env = Full()
    setattr(env, hook, "not a function")
    found = ACCESSORS[hook](env)
    if hook in CALLABLE_CHECKED:
        assert found is None
    else:
        assert found == "not a function"


def test_value_hooks() -> None:
    full, bare = Full(), Bare()
    assert hooks.scores_tokens(full) is True
    assert hooks.scores_tokens(bare) is False
    assert hooks.scores_tokens(type("Off", (Full,), {"scores_tokens": False})()) is False
    assert hooks.scores_tokens(type("Unset", (Full,), {"scores_tokens": None})()) is False
    assert hooks.evaluates_itself(full) is True
    assert hooks.evaluates_itself(bare) is False
    assert hooks.evaluates_itself(type("No", (Full,), {"evaluates_itself": lambda self: False})()) is False
    assert hooks.evaluates_itself(type("NoneHook", (Full,), {"evaluates_itself": None})()) is False
    assert hooks.env_name(full, "ref") == "full"
    assert hooks.env_name(bare, "ref") == "ref"
    assert hooks.env_description(full) == "has every hook"
    assert hooks.env_description(bare) == ""


# ---------------------------------------------------------------------------- the call sites


async def test_oracle_from_the_hooks_and_without_them() -> None:
    item = {"id": "i1", "prompt": "p"}
    model = agent_model_for(Full(), "oracle")(Full(), item)
    tools = [{"type": "function", "function": {"name": "terminal"}}]
    first = await model.complete([{"role": "user", "content": "p"}], tools)
    assert [c.name for c in first.tool_calls] == ["terminal"]
    assert first.reasoning == "thinking"
    done = [{"role": "user", "content": "p"}, {"role": "assistant", "content": ""}]
    last = await model.complete(done, tools)
    assert last.content == "answer i1"

    answerless = Full()
    answerless.oracle_answer = None  # type: ignore[assignment,method-assign]
    answerless.oracle_reasoning = None  # type: ignore[assignment,method-assign]
    model = agent_model_for(answerless, "oracle")(answerless, item)
    last = await model.complete(done, tools)
    assert last.content == "done" and last.reasoning is None

    for env in (
        type("Named", (Bare,), {"name": "bare"})(),
        type("NoCalls", (Full,), {"oracle_calls": None})(),
    ):
        with pytest.raises(ValueError, match="no oracle_calls"):
            agent_model_for(env, "oracle")  # type: ignore[arg-type]
    blanked = Full()
    blanked.oracle_calls = None  # type: ignore[assignment,method-assign]
    with pytest.raises(ValueError, match="no oracle_calls"):
        agent_model_for(blanked, "oracle")

    custom = Full()
    sentinel = agent_model_for(Full(), "none")
    custom.oracle_model_for = lambda: sentinel  # type: ignore[method-assign]
    assert agent_model_for(custom, "oracle") is sentinel


def test_sandbox_hooks_at_their_call_sites() -> None:
    base = SandboxConfig(kind="bwrap")
    assert env_sandbox_config(Full(), base).command_timeout_s == 123.0
    blanked = Full()
    blanked.sandbox_config = None  # type: ignore[assignment,method-assign]
    assert env_sandbox_config(blanked, base) is base
    assert env_sandbox_config(Bare(), base) is base  # type: ignore[arg-type]

    factory = object()  # never touched when the env has neither hook
    item = {"id": "i1"}
    assert _prepared(factory, Bare(), item) is factory  # type: ignore[arg-type]
    neither = Full()
    neither.prepare_sandbox = None  # type: ignore[assignment,method-assign]
    neither.sandbox_image = None  # type: ignore[assignment,method-assign]
    assert _prepared(factory, neither, item) is factory  # type: ignore[arg-type]
    imaged = _prepared(factory, Full(), item)  # type: ignore[arg-type]
    assert isinstance(imaged, _PreparingFactory) and imaged.image == "img-i1"
    assert imaged.prepare is not None


def test_registry_hook_at_its_call_site() -> None:
    env = Full()
    assert isinstance(env_registry(env), ToolRegistry)
    assert env.calls == ["registry"]
    blanked = Full()
    blanked.tool_registry = None  # type: ignore[assignment,method-assign]
    assert isinstance(env_registry(blanked), ToolRegistry) and blanked.calls == []


def test_system_prompt_hook_at_its_call_site() -> None:
    backends = RolloutBackends(ScriptedModel(["ok"]), object(), default_registry())  # type: ignore[arg-type]
    assert Rollouts(Full(), backends).agent_config(1).system_prompt == "sys"
    blanked = Full()
    blanked.system_prompt = None  # type: ignore[assignment,method-assign]
    blanked.config = blanked.config.model_copy(update={"system_prompt": "from config"})
    assert Rollouts(blanked, backends).agent_config(1).system_prompt == "from config"


async def test_run_evaluation_hook_at_its_call_site(tmp_path: Path, bwrap: Any) -> None:
    env = Full()
    backends = RolloutBackends(ScriptedModel(["done"]), bwrap, default_registry())
    run = await run_eval(env, backends, tmp_path / "own", n=3, group_size=2, agent="none")
    assert env.calls == ["run_evaluation n=3 g=2 agent=none"] and run.ran == 0

    class Plain(BaseEnv):
        name: ClassVar[str] = "plain"

        def generate(self, index: int, *, split: str) -> Item:
            return {"id": f"p{index}", "prompt": "p"}

        async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> float:
            return 1.0

        async def run_evaluation(self, *a: Any, **kw: Any) -> EvalRun:
            raise AssertionError("set to None on the instance: not a hook")

    plain = Plain()
    plain.run_evaluation = None  # type: ignore[assignment,method-assign]
    run = await run_eval(plain, backends, tmp_path / "plain", n=1, group_size=1, agent="none")
    assert run.ran == 1 and run.summary.mean_reward.value == 1.0


async def test_the_env_host_side_treats_missing_and_none_hooks_alike() -> None:
    """``child.py``'s item bundle and ``keep``/``rescore`` ops on an agent-written class."""
    r, w = os.pipe()
    try:
        server = _Server(r, w)
        bare = type("AgentEnv", (), {"item_id": lambda s, i: i["id"], "format_prompt": lambda s, i: "p"})()
        server._env = bare
        bundle = server._bundle({"id": "i"})
        assert (bundle["setup_files"], bundle["verifier_files"], bundle["category"]) == ({}, {}, None)
        assert await server._op_keep({"id": 1, "sandbox": {}, "item": {}, "result": {}}) == {}
        assert await server._op_rescore({"item": {}, "messages": [], "kept": {}}) is None

        class Hooked:
            def item_id(self, item: Item) -> str:
                return str(item["id"])

            def format_prompt(self, item: Item) -> str:
                return "p"

            def setup_files(self, item: Item) -> Mapping[str, str]:
                return {"a.txt": "A"}

            def verifier_files(self, item: Item) -> Mapping[str, str]:
                return {"t.sh": "T"}

            def category(self, item: Item) -> str:
                return "cat"

            async def rescore(self, item: Item, messages: Any, kept: Any) -> float:
                return 0.5

        hooked = Hooked()
        server._env = hooked
        bundle = server._bundle({"id": "i"})
        assert bundle["setup_files"] == {"a.txt": {"text": "A"}}
        assert bundle["verifier_files"] == {"t.sh": {"text": "T"}}
        assert bundle["category"] == "cat"
        assert (await server._op_rescore({"item": {}, "messages": [], "kept": {}}))["value"] == 0.5
        for hook in ("setup_files", "verifier_files", "category", "rescore"):
            setattr(hooked, hook, None)
        bundle = server._bundle({"id": "i"})
        assert (bundle["setup_files"], bundle["verifier_files"], bundle["category"]) == ({}, {}, None)
        assert await server._op_rescore({"item": {}, "messages": [], "kept": {}}) is None
    finally:
        os.close(r)
        os.close(w)
