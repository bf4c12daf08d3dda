"""The batch run's configuration: one pydantic model, from flags, a YAML file, or both.

Every impossible combination is rejected when the model is built, with a message that says what
to change, so nothing half-starts. The YAML file uses the same keys as the flags (dashes or
underscores); flags given on the command line win over the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trajforge.endpoint import pairing_problem
from trajforge.llm.dialects import check_dialect_name
from trajforge.llm.parsers import check_parser_name
from trajforge.llm.types import SamplingParams
from trajforge.sandbox.types import AgentKind, SandboxConfig, SandboxKind, refuse_python_agent
from trajforge.tools.config import ToolsConfig, ToolsConfigError, parse_tools_config
from trajforge.tools.limits import DEFAULT_MAX_COMMAND_TIMEOUT_S, ToolLimits

ProgressMode = Literal["auto", "rich", "plain", "none"]


def default_workers() -> int:
    """One worker process. Measured on 2 cores (docs/benchmarks.md): one asyncio process runs 64
    rollouts at ~80 trajectories/s with the machine 70% busy; a second process buys only ~13%
    more and doubles the load on the endpoint. ``--workers`` scales out on bigger machines."""
    return 1


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message says what to change."""


class BatchConfig(BaseModel):
    """Everything a ``trajforge batch`` run needs. API keys are never part of it (only the name
    of the environment variable that holds one)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

    # Each field is also a `trajforge batch` flag (cli/batch.py derives them): its description is
    # the flag's help, to which the CLI adds the default; a list is typed comma-separated there.
    dataset: Path = Field(description="JSONL dataset, one {'prompt': ...} per line")
    run_name: str = Field(description="run directory name under --output-dir")
    output_dir: Path = Field(Path("data"), description="parent of run directories")
    model: str | None = Field(
        None, description="model name at the endpoint (with --base-url; omit both for the embedded policy)"
    )
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint URL (with --model)")
    api_key_env: str | None = Field(
        None,
        description="NAME of the env var holding the API key, never the key (default: the endpoint's "
        "usual one, e.g. OPENAI_API_KEY or OPENROUTER_API_KEY; optional for local servers)",
    )
    distribution: str | None = Field(None, description="toolset distribution (default: 'default')")
    toolsets: list[str] | None = Field(None, description="fixed toolsets for every sample")
    concurrency: int = Field(64, ge=1, le=4096, description="rollouts at once per worker")
    workers: int = Field(
        default_factory=default_workers, ge=1, le=256, description="worker processes (ray: actors per node)"
    )
    backend: Literal["local", "ray"] = Field(
        "local",
        description="where rollouts run: local (worker processes here) | ray (rollout actors on every "
        "node of a Ray cluster; this process keeps the ledger and the output)",
    )
    ray_address: str | None = Field(
        None,
        description="with --backend ray: the cluster's address, HOST:PORT (default: a cluster running on "
        "this machine, else a new local one)",
    )
    max_turns: int = Field(30, ge=1, description="assistant turns per sample")
    max_samples: int | None = Field(None, ge=1, description="only the first N rows")
    resume: bool = Field(False, description="continue an existing run")
    seed: int = Field(
        0,
        description="base seed; each sample's own is derived from it and its key (toolsets, model calls)",
    )
    sandbox: SandboxKind = Field("bwrap", description="sandbox backend: bwrap|local|docker")
    sandbox_network: bool = Field(
        False,
        description="allow network inside sandboxes",
        json_schema_extra={"flag": "--network", "negatable": True},
    )
    sandbox_reuse: bool = Field(
        True,
        description="reset (verified) and reuse a finished sample's sandbox instead of building a new "
        "one (bwrap)",
    )
    # lazy by default: at 1024 rollouts x 3 s calls it gave 0.70-0.72 of the latency bound against
    # eager's 0.67-0.68, with 14-22% fewer builds and 14-22% less memory per live rollout; at 64
    # rollouts x 200 ms the two were within noise (docs/benchmarks.md, "Scale at realistic latency").
    sandbox_agent: AgentKind = Field(
        "auto",
        description="the exec agent in each sandbox: auto and native both mean exec_agent.c, built "
        "here with cc at the first sandbox (static in docker); python was removed (install a C "
        "compiler: apt-get install gcc libc6-dev)",
    )
    _no_python_agent = field_validator("sandbox_agent", mode="before")(refuse_python_agent)
    sandbox_start: Literal["eager", "lazy"] = Field(
        "lazy",
        description="lazy: start a sample's sandbox at its first tool call (less memory per live "
        "rollout; samples that call no tool build none); eager: with its first model call (start-up "
        "hidden behind it). Setup files force eager",
    )
    command_timeout: float = Field(
        60.0, gt=0, description="timeout of a sandbox command the model gives none, s"
    )
    max_command_timeout: float = Field(
        DEFAULT_MAX_COMMAND_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="longest timeout the model may give one command (terminal, process wait), s; "
        "longer is clamped and the model told",
    )
    max_tokens: int | None = Field(None, ge=1, description="max tokens per model call")
    temperature: float | None = Field(None, ge=0, description="sampling temperature")
    reasoning_effort: str | None = Field(None, description="low|medium|high")
    no_reasoning: bool = Field(False, description="ask the model not to reason")
    system_prompt: str | None = Field(None, description="system prompt (kept in records)")
    ephemeral_system_prompt: str | None = Field(None, description="system prompt sent, never saved")
    prefill_messages: Path | None = Field(
        None, description="JSON file of messages sent after the system prompt, never saved"
    )
    provider_allow: list[str] | None = Field(None, description="providers to use")
    provider_ignore: list[str] | None = Field(None, description="providers to avoid")
    provider_order: list[str] | None = Field(None, description="provider preference")
    provider_sort: str | None = Field(None, description="price|throughput|latency")
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="JSON object merged into each request"
    )
    require_reasoning: bool = Field(True, description="filter samples without reasoning")
    sample_timeout: float = Field(600.0, gt=0, description="deadline per sample attempt, s")
    max_attempts: int = Field(3, ge=1, description="attempts per sample on infra failures")
    retry_backoff: float = Field(1.0, ge=0, description="first retry delay, doubled each time, s")
    rate_limit: float | None = Field(None, gt=0, description="endpoint requests/s across all workers")
    max_concurrent_requests: int | None = Field(
        None, ge=1, description="endpoint requests in flight, all workers"
    )
    request_timeout: float = Field(120.0, gt=0, description="timeout of one model request, s")
    request_retries: int = Field(5, ge=0, description="client retries of one transient request failure")
    skip_bad_rows: bool = Field(False, description="record bad dataset rows as failed samples")
    data_root: Path | None = Field(
        None,
        description="directory a row's cwd must lie under (default: the dataset file's own directory); a "
        "row whose cwd is outside it is a bad row, and no link beneath it is followed when the cwd is "
        "copied in",
    )
    fsync: bool = Field(True, description="fsync shards before the ledger marks their samples done")
    merge_interval: float = Field(
        30.0,
        gt=0,
        description="seconds between rebuilds of the merged .jsonl files while the run goes (longer "
        "when a rebuild is slow: at most 5% of one core)",
    )
    progress: ProgressMode = Field(
        "auto", description="auto|rich|plain|none (auto: rich on a terminal, plain log lines otherwise)"
    )
    samples_per_prompt: int = Field(
        1,
        ge=1,
        le=1024,
        description="samples of each row (own sandbox and seed; lines share prompt_index)",
        json_schema_extra={"flag": "--group-size"},
    )
    env: str | None = Field(
        None,
        description="grade each sample in its sandbox: an env (trajforge env list, path/file.py:Class) or a "
        "reward function (path/file.py:func, module:func); lines then carry reward",
    )
    tokenizer: str | None = Field(
        None,
        description="token level: LOCAL tokenizer dir of the model ('auto': the embedded policy's); calls "
        "go to a completions/generate endpoint and lines carry exact tokens, masks and logprobs",
    )
    completion_endpoint: Literal["auto", "openai_completions", "vllm_generate", "sglang_generate"] = Field(
        "auto", description="with --tokenizer: the endpoint's completion API (auto: its dialect's)"
    )
    tool_call_parser: str = Field(
        "auto",
        description="tool-call format of the model (auto: detect it; none: never parse text): the token-level "
        "client parses with it, and calls an endpoint returned as text are run (auto: unless the dialect "
        "says the server parses calls itself)",
    )
    endpoint_dialect: str = Field(
        "auto",
        description="which server --base-url is: openai, vllm, sglang, llamacpp, llamacpp_python, ollama, "
        "openrouter, trajforge (docs/servers.md); auto: probe what it says about itself",
    )
    # Not a flag of its own (a nested section): the YAML `tools:` section or --tools-config FILE.
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig,
        description="backends of the web/browser/vision/image_gen/moa toolsets (trajforge tools list)",
    )

    @model_validator(mode="after")
    def _check(self) -> BatchConfig:
        if self.distribution is not None and self.toolsets is not None:
            raise ValueError("give either --distribution or --toolsets, not both")
        if self.toolsets is not None and not self.toolsets:
            raise ValueError("--toolsets is empty; name at least one toolset (e.g. terminal,file)")
        problem = pairing_problem(self.model, self.base_url)  # the same rule as `trajforge run`
        if problem:
            raise ValueError(problem)
        if self.command_timeout > self.max_command_timeout:
            raise ValueError(
                f"command_timeout {self.command_timeout:g}s is above --max-command-timeout "
                f"{self.max_command_timeout:g}s; lower the first or raise the second"
            )
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError("--ray-address needs --backend ray")
        if self.no_reasoning and self.reasoning_effort:
            raise ValueError("--no-reasoning and --reasoning-effort contradict each other; drop one")
        if not self.run_name or "/" in self.run_name or self.run_name in {".", ".."}:
            raise ValueError(f"--run-name {self.run_name!r} must be a plain directory name")
        if self.tokenizer == "auto" and not self.embedded:
            raise ValueError(
                "--tokenizer auto is the embedded policy's tokenizer; give a directory with --base-url"
            )
        check_dialect_name(self.endpoint_dialect)
        check_parser_name(self.tool_call_parser)
        if self.api_key_env == "":  # `--api-key-env ''`: an endpoint that needs no key
            self.api_key_env = None
        if self.api_key_env is not None and not self.api_key_env.isidentifier():
            raise ValueError(
                "--api-key-env takes the NAME of an environment variable (e.g. OPENAI_API_KEY), not a key"
            )
        return self

    @property
    def embedded(self) -> bool:
        """No endpoint given: the run serves the embedded tiny policy itself."""
        return self.model is None and self.base_url is None

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name

    @property
    def distribution_name(self) -> str | None:
        """The distribution in use, ``None`` when fixed toolsets are given."""
        if self.toolsets is not None:
            return None
        return self.distribution or "default"

    def sampling(self) -> SamplingParams:
        """Per-request sampling settings, provider routing folded into ``extra_body``."""
        extra = dict(self.extra_body)
        provider: dict[str, Any] = dict(extra.get("provider") or {})
        for key, value in (
            ("only", self.provider_allow),
            ("ignore", self.provider_ignore),
            ("order", self.provider_order),
            ("sort", self.provider_sort),
        ):
            if value:
                provider[key] = value
        if provider:
            extra["provider"] = provider
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            reasoning_effort=self.reasoning_effort,
            reasoning_disabled=self.no_reasoning,
            extra_body=extra,
        )

    def tool_limits(self) -> ToolLimits:
        """What a model may set in its tool arguments (see :class:`ToolLimits`)."""
        return ToolLimits(max_command_timeout_s=self.max_command_timeout)

    def sandbox_config(self, root_dir: Path | None = None) -> SandboxConfig:
        return SandboxConfig(
            kind=self.sandbox,
            network=self.sandbox_network,
            reuse=self.sandbox_reuse,
            agent=self.sandbox_agent,
            command_timeout_s=self.command_timeout,
            root_dir=str(root_dir) if root_dir else None,
        )

    def public_dict(self) -> dict[str, Any]:
        """The config as saved in run.json (paths as strings; holds no secret by construction)."""
        return self.model_dump(mode="json")


def _normalise_keys(data: dict[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(config_file: Path | None, overrides: dict[str, Any]) -> BatchConfig:
    """Build the config from an optional YAML file and the flags actually given (``None`` = not
    given), flags winning. Raises :class:`ConfigError` with a readable message."""
    data: dict[str, Any] = {}
    if config_file is not None:
        try:
            loaded = yaml.safe_load(Path(config_file).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {config_file} must hold a mapping of option: value")
        data = _normalise_keys(loaded)
        if "api_key" in data:
            raise ConfigError(
                f"config file {config_file} contains an API key; put it in an environment "
                "variable and name it with api_key_env instead"
            )
    data.update({k: v for k, v in _normalise_keys(overrides).items() if v is not None})
    try:  # its own messages: `tools.vision.endpoint.base_url: ...`, not a flag name
        data["tools"] = parse_tools_config(data.get("tools"))
    except ToolsConfigError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return BatchConfig(**data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc)) from exc


def flag_name(field: str) -> str:
    """The CLI spelling of a config field (cli/config_flags.py names flags the same way)."""
    if field == "dataset":
        return "DATASET (the first argument)"
    info = BatchConfig.model_fields.get(field)
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("flag") or "--" + field.replace("_", "-"))


def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        where = flag_name(str(err["loc"][0])) + "".join(f".{x}" for x in err["loc"][1:]) if err["loc"] else ""
        parts.append(f"{where}: {msg}" if where else msg)
    return "invalid batch configuration: " + "; ".join(parts)
