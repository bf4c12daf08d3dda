"""Settings of ``trajforge serve``, validated before any model is loaded.

A typo in a path or a nonsensical batch size should fail in milliseconds with a message that
says what to change, not after a model has been loaded for a minute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LogprobsMode = Literal["raw", "processed"]
"""``raw``: log-softmax of the model's logits, before temperature/top-p/top-k (vLLM's default
``raw_logprobs``). ``processed``: log-probability under the distribution actually sampled from
(after temperature, top-k and top-p; 0.0 for greedy decoding)."""

READY_PREFIX = "trajforge serve: listening on "
"""The line ``trajforge serve`` prints (flushed) once it accepts requests; the launcher waits for it."""


def check_model_dir(path: Path) -> Path:
    """Raise ``ValueError`` unless ``path`` is a local transformers model directory."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ValueError(
            f"model path {str(path)!r} does not exist; pass a local transformers model directory "
            "(one with config.json, the weights and the tokenizer files)"
        )
    if not path.is_dir():
        raise ValueError(f"model path {str(path)!r} is a file; pass the directory that contains config.json")
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model path {str(path)!r} has no config.json; save the model with "
            "model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)"
        )
    return path.resolve()


class ServeConfig(BaseModel):
    """Everything ``trajforge serve`` needs; one object handed from the CLI to the server."""

    model_config = ConfigDict(frozen=True, protected_namespaces=(), allow_inf_nan=False)

    model_path: Path = Field(description="local transformers model directory (config, weights, tokenizer)")
    served_model_name: str | None = Field(
        default=None,
        description="the model id clients send and /v1/models lists; default: the directory name",
    )
    host: str = Field(
        default="127.0.0.1", description="interface to bind; loopback unless you mean otherwise"
    )
    port: int = Field(default=8000, ge=0, le=65535, description="0 picks a free port (printed at startup)")
    parser: str | None = Field(
        default="hermes",
        description="tool-call parser family for chat completions ('none' disables parsing)",
        json_schema_extra={"flag": "--tool-call-parser"},
    )
    max_batch: int = Field(default=8, ge=1, le=1024, description="most sequences generated together")
    batch_wait_ms: float = Field(
        default=5.0, ge=0, le=10_000, description="how long the engine waits for more requests to batch"
    )
    device: str = Field(
        default="auto", description="auto (cuda when torch sees one, else cpu), cpu, cuda, cuda:N"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: float32 on CPU (exact logprobs), bfloat16 on GPU"
    )
    default_max_tokens: int = Field(
        default=1024, ge=1, description="max_tokens when a request gives none (capped by the context length)"
    )
    logprobs_mode: LogprobsMode = Field(default="raw", description="see LogprobsMode")
    token_file: Path | None = Field(
        default=None,
        description="where the server writes its token for the mutating endpoints (mode 0600, removed "
        "at exit); `trajforge serve` defaults to $XDG_RUNTIME_DIR/trajforge/serve-PORT.token or "
        "~/.cache/trajforge/serve/serve-PORT.token",
    )
    weights_dir: Path | None = Field(
        default=None,
        description="/v1/load_weights loads only checkpoint directories inside this one (default: any "
        "the server's user can read, for a caller with the token)",
    )

    @field_validator("model_path")
    @classmethod
    def _model_dir(cls, value: Path) -> Path:
        return check_model_dir(value)

    @field_validator("parser")
    @classmethod
    def _parser_name(cls, value: str | None) -> str | None:
        if value is None or value.lower() in ("", "none"):
            return None
        return value

    @model_validator(mode="after")
    def _name(self) -> ServeConfig:
        if not self.served_model_name:
            object.__setattr__(self, "served_model_name", self.model_path.name)
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path.name
