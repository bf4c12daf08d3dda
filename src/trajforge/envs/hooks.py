"""The optional env hooks: what an env *may* define beyond :class:`~trajforge.envs.protocol.AgentEnv`.

Each hook is one small runtime-checkable Protocol, so an env author finds them in one place
(docs/envs.md lists them) and mypy sees their types where trajforge calls them. An env defines a
hook by having a method (or, for the three attributes, a class attribute) of that name; nothing
is registered and nothing needs subclassing.

trajforge never reads a hook with a bare ``getattr``: it calls the accessor below (``*_hook(env)``
returns the bound hook or None), which keeps one rule everywhere: a hook that is absent or set
to ``None`` (on the class or on the instance) is no hook. The accessors of hooks that used to be
looked up with ``callable(...)`` also treat a non-callable value as no hook; the others hand on
what is there, so a broken value fails loudly where it is called. Call sites use the accessors,
not a bare ``isinstance``: Python 3.11's protocol check looks at the class first, so an
instance's ``self.hook = None`` over a class's method passes it (the accessor hands on the
instance's ``None``).

``setup_files``, ``verifier_files``, ``keep``, ``rescore`` and ``category`` are part of
``AgentEnv`` (``BaseEnv`` gives defaults); they are declared here too because an env the RL agent
wrote runs in the env host (:mod:`trajforge.envs.sandboxed.child`) as whatever class it is, and
may leave them out.

This module sits below ``episode``, ``runner`` and ``agents`` (they read hooks through it), so it
names nothing of theirs, not even for typing: ``run_evaluation``'s ``RolloutBackends`` and
``EvalRun`` are ``Any`` here (the caller, :func:`~trajforge.envs.running.evaluate.run_eval`, types them), and
a per-item model factory is spelled out as ``ModelFactory`` (``episode.ModelFor``'s shape).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.protocol import AgentEnv
    from trajforge.envs.types import Episode, Item, RewardBreakdown
    from trajforge.envs.verifier import VerifierContext
    from trajforge.protocols import ChatModel, Sandbox
    from trajforge.sandbox.types import SandboxConfig
    from trajforge.tools.registry import ToolRegistry

__all__ = [
    "EvaluatesItself",
    "HasAclose",
    "HasCategory",
    "HasDescription",
    "HasKeep",
    "HasName",
    "HasNotes",
    "HasOracleAnswer",
    "HasOracleCalls",
    "HasOracleModelFor",
    "HasOracleReasoning",
    "HasPrepareSandbox",
    "HasRescore",
    "HasRunEvaluation",
    "HasSandboxConfig",
    "HasSandboxImage",
    "HasSetupFiles",
    "HasSystemPrompt",
    "HasTemplateKey",
    "HasToolRegistry",
    "HasVerifierFiles",
    "ModelFactory",
    "ScoresTokens",
    "aclose_hook",
    "category_hook",
    "env_description",
    "env_name",
    "evaluates_itself",
    "keep_hook",
    "notes_hook",
    "oracle_answer_hook",
    "oracle_calls_hook",
    "oracle_model_for_hook",
    "oracle_reasoning_hook",
    "prepare_sandbox_hook",
    "rescore_hook",
    "run_evaluation_hook",
    "sandbox_config_hook",
    "sandbox_image_hook",
    "scores_tokens",
    "setup_files_hook",
    "system_prompt_hook",
    "template_key_hook",
    "tool_registry_hook",
    "verifier_files_hook",
]

ModelFactory = Callable[["AgentEnv", "Item"], "ChatModel"]
"""The per-item model of a rollout, ``(env, item) -> ChatModel`` (``episode.ModelFor``)."""

# ---------------------------------------------------------------------------- the prompt


@runtime_checkable
class HasSystemPrompt(Protocol):
    def system_prompt(self) -> str | None:
        """The system prompt of every rollout (``BaseEnv``: ``config.system_prompt`` or the
        class's ``default_system_prompt``). Called when a rollout's agent config is built
        (:meth:`Rollouts.agent_config`) and once when the env host starts an agent-written env.
        Without it the rollout gets ``config.system_prompt``."""
        ...


# ---------------------------------------------------------------------------- the sandbox


@runtime_checkable
class HasSandboxConfig(Protocol):
    def sandbox_config(self, base: SandboxConfig) -> SandboxConfig:
        """``base`` (the run's sandbox settings) with what this env's commands need added (extra
        read-only binds, ``PATH``): yc_bench binds its benchmark virtualenv. Called by
        :func:`~trajforge.envs.running.episode.env_sandbox_config` wherever a sandbox factory is built
        for the env (the CLI, each Ray actor, the trainers), once per factory. Returns a new
        ``SandboxConfig``; never mutates ``base``."""
        ...


@runtime_checkable
class HasPrepareSandbox(Protocol):
    async def prepare_sandbox(self, item: Item, sandbox: Sandbox) -> None:
        """Build the item's starting state in a fresh sandbox (a Dockerfile's ``COPY``/``RUN``
        steps, a repository checked out and installed). Called before the rollout and before
        ``setup_files`` are written: in every rollout's sandbox, or once per
        :class:`HasTemplateKey` key in a template the rollouts fork from. Raising is a sandbox
        start failure: the episode fails with the reason and is not scored."""
        ...


@runtime_checkable
class HasSandboxImage(Protocol):
    def sandbox_image(self, item: Item) -> str | None:
        """The container image of the item's sandbox (docker backend; terminal_bench builds one
        per task), or None for the factory's own. Called once per rollout, when its sandbox is
        created. An env with this hook never forks from templates."""
        ...


@runtime_checkable
class HasTemplateKey(Protocol):
    def template_key(self, item: Item) -> str | None:
        """The name of the item's shared starting state: rollouts of one key (a GRPO group, the
        same repository later) fork from one template that ``prepare_sandbox`` ran in once.
        Called once per rollout, only when the env also has ``prepare_sandbox``, has no
        ``sandbox_image`` and the backend forks (bwrap, local). None: prepared per rollout."""
        ...


# ---------------------------------------------------------------------------- the oracle agent


@runtime_checkable
class HasOracleCalls(Protocol):
    def oracle_calls(self, item: Item) -> Sequence[tuple[str, dict[str, Any]]]:
        """The tool calls of the item's reference solution, ``[(tool name, arguments)]``, made
        one per turn by ``--agent oracle`` (:mod:`trajforge.envs.agents`). Called once per
        oracle rollout. Without it (and without ``oracle_model_for``) ``--agent oracle``
        refuses to run, saying so."""
        ...


@runtime_checkable
class HasOracleAnswer(Protocol):
    def oracle_answer(self, item: Item, messages: list[dict[str, Any]]) -> str:
        """The oracle's final answer, built from the conversation so far (what its tools
        printed). Called once, after the last oracle call; without it the oracle answers
        ``done``."""
        ...


@runtime_checkable
class HasOracleReasoning(Protocol):
    def oracle_reasoning(self, item: Item, messages: list[dict[str, Any]]) -> str | None:
        """The reasoning of the oracle's next turn, given the conversation so far, so oracle
        trajectories used as training data are written in the policy's own style. Called on
        every oracle turn; None or absent: no reasoning."""
        ...


@runtime_checkable
class HasOracleModelFor(Protocol):
    def oracle_model_for(self) -> ModelFactory | None:
        """The whole per-item oracle model (``(env, item) -> ChatModel``), for an oracle that
        is not a fixed list of calls. Called once when ``--agent oracle`` starts; when it returns
        something callable, that is the oracle and the other ``oracle_*`` hooks are not used."""
        ...


# ---------------------------------------------------------------------------- the run


@runtime_checkable
class HasToolRegistry(Protocol):
    def tool_registry(self) -> ToolRegistry:
        """The registry the env's rollouts call tools from, for tools that need configuring
        (web_research: its search provider). Called once per run where the backends are built
        (:func:`~trajforge.envs.running.backends.env_registry`); without it the default
        registry. The run closes it."""
        ...


@runtime_checkable
class HasRunEvaluation(Protocol):
    async def run_evaluation(
        self,
        backends: Any,
        run_dir: Path,
        *,
        n: int,
        group_size: int,
        agent: str = "model",
        on_episode: Callable[[Episode, int, int], None] | None = None,
        fit: Callable[[int | None], int | None] = ...,
        announce: Callable[[str], None] = ...,
    ) -> Any:
        """The whole ``env eval`` of this env, in place of trajforge's rollouts (a Hermes seed
        env whose evaluation is its own ``evaluate()``). Called by
        :func:`~trajforge.envs.running.evaluate.run_eval` after the token budget is fitted (``fit`` maps a
        wanted ``max_tokens`` to what the endpoint allows); it keeps the same books in
        ``run_dir`` (``run_episodes`` does) and returns the run. ``backends`` is the run's
        ``RolloutBackends``, the result an ``EvalRun`` (``Any`` here: see the module's docstring)."""
        ...


@runtime_checkable
class EvaluatesItself(Protocol):
    def evaluates_itself(self) -> bool:
        """Whether this env's evaluation is its own code in this process (then ``env eval
        --backend ray`` refuses it, saying why). Called once by ``env eval`` before the run."""
        ...


@runtime_checkable
class HasNotes(Protocol):
    def notes(self) -> Iterable[str]:
        """Lines an operator should read about how this env runs here (a seed env: its
        server configs are not used). Called once by ``env eval``; each is printed as
        ``note: ...``."""
        ...


@runtime_checkable
class ScoresTokens(Protocol):
    @property
    def scores_tokens(self) -> bool:
        """True when the env's reward carries per-token advantages (opd's teacher log-probs):
        the TRL adapter then passes them to the trainer. Read once when a trainer is built; a
        class attribute (``scores_tokens: ClassVar[bool] = True``)."""
        ...


@runtime_checkable
class HasAclose(Protocol):
    async def aclose(self) -> None:
        """Release what the env holds (an agent-written env's env host process). Called once
        when trajforge is done with an env it loaded only to read something from it."""
        ...


# ---------------------------------------------------------------------------- identity


@runtime_checkable
class HasName(Protocol):
    @property
    def name(self) -> str:
        """The env's name (``trajforge env list``, run names, the Atropos class name). Read
        where a name is shown; without one the caller's default (its reference)."""
        ...


@runtime_checkable
class HasDescription(Protocol):
    @property
    def description(self) -> str:
        """One line shown by ``trajforge env list`` and the RL ops agent; empty without one."""
        ...


# ---------------------------------------------------------------------------- AgentEnv's own (agent-written envs may omit them)


@runtime_checkable
class HasSetupFiles(Protocol):
    def setup_files(self, item: Item) -> Mapping[str, bytes | str]:
        """Files (workdir-relative path -> content) written before the rollout starts. Called
        once per item handed out; without it none."""
        ...


@runtime_checkable
class HasVerifierFiles(Protocol):
    def verifier_files(self, item: Item) -> Mapping[str, bytes | str]:
        """Files placed after the rollout ended, just before ``compute_reward`` (hidden tests):
        the agent can neither see nor plant them. Called once per item handed out."""
        ...


@runtime_checkable
class HasCategory(Protocol):
    def category(self, item: Item) -> str | None:
        """The item's group label for per-category results. Called once per item handed out;
        without it None."""
        ...


@runtime_checkable
class HasKeep(Protocol):
    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        """JSON data stored with the episode so ``rescore`` can judge it again without the
        model. Called after ``compute_reward``, in the rollout's sandbox; without it ``{}``."""
        ...


@runtime_checkable
class HasRescore(Protocol):
    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> float | RewardBreakdown | None:
        """The reward from a stored episode alone (``env rescore``), or None when the env
        cannot judge without a sandbox. Without it: None."""
        ...


# ---------------------------------------------------------------------------- the accessors


def system_prompt_hook(env: object) -> Callable[[], str | None] | None:
    """``env.system_prompt`` when it is a callable hook, else None."""
    return env.system_prompt if isinstance(env, HasSystemPrompt) and callable(env.system_prompt) else None


def sandbox_config_hook(env: object) -> Callable[[SandboxConfig], SandboxConfig] | None:
    """``env.sandbox_config`` when it is a callable hook, else None."""
    return env.sandbox_config if isinstance(env, HasSandboxConfig) and callable(env.sandbox_config) else None


def prepare_sandbox_hook(env: object) -> Callable[[Item, Sandbox], Awaitable[None]] | None:
    """``env.prepare_sandbox``, or None where it is absent or None."""
    return env.prepare_sandbox if isinstance(env, HasPrepareSandbox) else None


def sandbox_image_hook(env: object) -> Callable[[Item], str | None] | None:
    """``env.sandbox_image``, or None where it is absent or None."""
    return env.sandbox_image if isinstance(env, HasSandboxImage) else None


def template_key_hook(env: object) -> Callable[[Item], str | None] | None:
    """``env.template_key``, or None where it is absent or None."""
    return env.template_key if isinstance(env, HasTemplateKey) else None


def oracle_calls_hook(env: object) -> Callable[[Item], Sequence[tuple[str, dict[str, Any]]]] | None:
    """``env.oracle_calls`` when it is a callable hook, else None."""
    return env.oracle_calls if isinstance(env, HasOracleCalls) and callable(env.oracle_calls) else None


def oracle_answer_hook(env: object) -> Callable[[Item, list[dict[str, Any]]], str] | None:
    """``env.oracle_answer`` when it is a callable hook, else None."""
    return env.oracle_answer if isinstance(env, HasOracleAnswer) and callable(env.oracle_answer) else None


def oracle_reasoning_hook(env: object) -> Callable[[Item, list[dict[str, Any]]], str | None] | None:
    """``env.oracle_reasoning`` when it is a callable hook, else None."""
    if isinstance(env, HasOracleReasoning) and callable(env.oracle_reasoning):
        return env.oracle_reasoning
    return None


def oracle_model_for_hook(env: object) -> Callable[[], ModelFactory | None] | None:
    """``env.oracle_model_for`` when it is a callable hook, else None."""
    if isinstance(env, HasOracleModelFor) and callable(env.oracle_model_for):
        return env.oracle_model_for
    return None


def tool_registry_hook(env: object) -> Callable[[], ToolRegistry] | None:
    """``env.tool_registry`` when it is a callable hook, else None."""
    return env.tool_registry if isinstance(env, HasToolRegistry) and callable(env.tool_registry) else None


def run_evaluation_hook(env: object) -> Callable[..., Awaitable[Any]] | None:
    """``env.run_evaluation`` (its signature: :class:`HasRunEvaluation`), or None where it is
    absent or None."""
    return env.run_evaluation if isinstance(env, HasRunEvaluation) else None


def evaluates_itself(env: object) -> bool:
    """``env.evaluates_itself()``; False without the hook (absent or None)."""
    hook = env.evaluates_itself if isinstance(env, EvaluatesItself) else None
    return bool(hook()) if hook is not None else False


def notes_hook(env: object) -> Callable[[], Iterable[str]] | None:
    """``env.notes`` when it is a callable hook, else None."""
    return env.notes if isinstance(env, HasNotes) and callable(env.notes) else None


def scores_tokens(env: object) -> bool:
    """Whether the env's ``scores_tokens`` attribute is true (False without one)."""
    return isinstance(env, ScoresTokens) and bool(env.scores_tokens)


def aclose_hook(env: object) -> Callable[[], Awaitable[None]] | None:
    """``env.aclose``, or None where it is absent or None."""
    return env.aclose if isinstance(env, HasAclose) else None


def env_name(env: object, default: str) -> str:
    """``str(env.name)``, or ``default`` for an env without a ``name``."""
    return str(env.name) if isinstance(env, HasName) else default


def env_description(env: object) -> str:
    """``str(env.description)``, or ``""`` for an env without one."""
    return str(env.description) if isinstance(env, HasDescription) else ""


def setup_files_hook(env: object) -> Callable[[Item], Mapping[str, bytes | str]] | None:
    """``env.setup_files``, or None where it is absent or None."""
    return env.setup_files if isinstance(env, HasSetupFiles) else None


def verifier_files_hook(env: object) -> Callable[[Item], Mapping[str, bytes | str]] | None:
    """``env.verifier_files``, or None where it is absent or None."""
    return env.verifier_files if isinstance(env, HasVerifierFiles) else None


def category_hook(env: object) -> Callable[[Item], str | None] | None:
    """``env.category`` when it is a callable hook, else None."""
    return env.category if isinstance(env, HasCategory) and callable(env.category) else None


def keep_hook(
    env: object,
) -> Callable[[Item, AgentResult, VerifierContext], Awaitable[dict[str, Any]]] | None:
    """``env.keep``, or None where it is absent or None."""
    return env.keep if isinstance(env, HasKeep) else None


def rescore_hook(
    env: object,
) -> Callable[[Item, list[dict[str, Any]], dict[str, Any]], Awaitable[float | RewardBreakdown | None]] | None:
    """``env.rescore``, or None where it is absent or None."""
    return env.rescore if isinstance(env, HasRescore) else None
