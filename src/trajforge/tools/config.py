"""The ``tools:`` configuration: endpoints, providers and policies of every toolset, in one model.

It is the ``tools`` section of a batch YAML config (or the file of ``--tools-config``). Nothing
in it is a secret: an endpoint names the *environment variable* that holds its key. Each
toolset's part says whether its backend is configured (``ready``); a toolset that is not is not
offered (see :func:`trajforge.tools.builtin.build_registry`).

Example::

    tools:
      network: {allow_cidrs: ["10.1.0.0/16"]}      # also lets the host reach the intranet
      web: {provider: searxng, endpoint: "http://searx.internal:8080"}
      browser: {executable: /usr/bin/chromium}
      vision:
        endpoint: {base_url: "https://api.openai.com/v1", model: gpt-4o-mini, api_key_env: OPENAI_API_KEY}
      image_gen: {base_url: "https://api.openai.com/v1", model: gpt-image-1, response_format: null}
      moa:
        reference_models:
          - {base_url: "http://gpu1:8000/v1", model: qwen}
          - {base_url: "https://openrouter.ai/api/v1", model: deepseek/deepseek-r1, api_key_env: OPENROUTER_API_KEY}
        aggregator: {base_url: "https://openrouter.ai/api/v1", model: anthropic/claude-sonnet-4, api_key_env: OPENROUTER_API_KEY}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trajforge.tools.browser import BrowserConfig
from trajforge.tools.image_gen import ImageGenConfig
from trajforge.tools.moa import MoAConfig
from trajforge.tools.netpolicy import NetPolicy
from trajforge.tools.vision import VisionConfig
from trajforge.tools.web import WebConfig


class ToolsConfigError(ValueError):
    """A tools configuration that cannot be used; the message names the key and what to change."""


class ToolsConfig(BaseModel):
    """Backends of the toolsets that need one. The empty config offers terminal and file only."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    network: NetPolicy = Field(
        default_factory=NetPolicy,
        description="where the host may fetch for a model: web, browser, and the image URLs of "
        "vision and image_gen (one policy for all; non-public addresses denied unless allowed)",
    )
    web: WebConfig = Field(default_factory=WebConfig, description="search provider, extraction limits")
    browser: BrowserConfig = Field(
        default_factory=BrowserConfig, description="Chromium binary, viewport, timeouts and limits"
    )
    vision: VisionConfig = Field(default_factory=VisionConfig)
    image_gen: ImageGenConfig = Field(default_factory=ImageGenConfig)
    moa: MoAConfig = Field(default_factory=MoAConfig)
    image_fetch_timeout_s: float = Field(
        30.0, gt=0, description="deadline of the host's fetch of an image URL (vision, image_gen), s"
    )

    @model_validator(mode="after")
    def _one_policy(self) -> ToolsConfig:
        for name in ("web", "browser"):
            if "policy" in getattr(self, name).model_fields_set:
                raise ValueError(
                    f"set the network policy once, as tools.network (it applies to web, browser "
                    f"and image fetches alike), not as tools.{name}.policy"
                )
        return self

    def web_config(self) -> WebConfig:
        """The web settings under :attr:`network`."""
        return self.web.model_copy(update={"policy": self.network})

    def browser_config(self) -> BrowserConfig:
        """The browser settings under :attr:`network`."""
        return self.browser.model_copy(update={"policy": self.network})


def parse_tools_config(data: Any, source: str = "tools") -> ToolsConfig:
    """A :class:`ToolsConfig` from a mapping, or :class:`ToolsConfigError` listing every problem
    as ``tools.<key>: what is wrong``."""
    if data is None:
        return ToolsConfig()
    if isinstance(data, ToolsConfig):
        return data
    if not isinstance(data, dict):
        raise ToolsConfigError(f"{source} must be a mapping of toolset: settings")
    _refuse_inline_keys(data, source)
    try:
        return ToolsConfig.model_validate(data)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            where = ".".join(str(x) for x in (source, *err["loc"]))
            parts.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        raise ToolsConfigError("invalid tools configuration: " + "; ".join(parts)) from None


def load_tools_config(path: Path) -> ToolsConfig:
    """The tools configuration of a YAML file: either its ``tools:`` section or the whole file."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ToolsConfigError(f"cannot read tools config {path}: {exc}") from None
    if isinstance(data, dict) and "tools" in data:  # a batch config: its tools section
        data = data["tools"]
    return parse_tools_config(data, f"tools (from {path})")


def _refuse_inline_keys(data: Any, where: str) -> None:
    """A key pasted into the config (``api_key: sk-...``) is refused before it is kept anywhere."""
    if isinstance(data, dict):
        for key, value in data.items():
            if str(key).lower() in {"api_key", "key", "token", "secret", "password"}:
                raise ToolsConfigError(
                    f"{where}.{key}: secrets never go in the config; put the key in an environment "
                    "variable and name it with api_key_env"
                )
            _refuse_inline_keys(value, f"{where}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _refuse_inline_keys(value, f"{where}[{i}]")
