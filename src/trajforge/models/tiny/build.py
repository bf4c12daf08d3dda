"""The documented recipe: synthetic trajectories -> BPE tokenizer -> Qwen2 decoder -> TRL SFT.

``build_tiny`` writes a self-contained model directory (config, safetensors, tokenizer, chat
template, ``recipe.json`` and a README model card) that ``trajforge serve`` and
:class:`trajforge.models.tiny.evaluate.LocalPolicy` load directly.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trajforge.models.tiny.data import TRAIN_FAMILIES, copy_drills, synthesize
from trajforge.models.tiny.train import ModelShape, TrainSettings
from trajforge.sandbox.types import SandboxKind


@dataclass(frozen=True)
class BuildConfig:
    """Everything the recipe depends on; ``quick()`` gives a smoke-test sized variant."""

    examples: int = 4000
    drills: int = 4000
    """Short "repeat this value" conversations mixed in (see ``data.copy_drills``)."""
    vocab_size: int = 1024
    seed: int = 0
    sandbox_kind: SandboxKind = "bwrap"
    families: tuple[str, ...] = TRAIN_FAMILIES
    shape: ModelShape = field(default_factory=ModelShape)
    train: TrainSettings = field(default_factory=TrainSettings)

    @classmethod
    def quick(cls) -> BuildConfig:
        return cls(
            examples=160,
            drills=160,
            vocab_size=512,
            shape=ModelShape(
                hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
            ),
            train=TrainSettings(steps=30, batch_size=8, logging_steps=5),
        )

    def with_steps(self, steps: int | None) -> BuildConfig:
        return self if steps is None else replace(self, train=replace(self.train, steps=steps))


class BuildReport(BaseModel):
    """What a build did; saved as ``recipe.json`` next to the weights."""

    config: dict[str, Any]
    conversations: int
    drills: int = 0
    rejected: list[tuple[str, str]]
    too_long: int
    train_tokens: int
    assistant_tokens: int
    parameters: int
    weights_bytes: int
    loss_curve: list[tuple[int, float]]
    seconds: dict[str, float]

    @property
    def first_loss(self) -> float | None:
        return self.loss_curve[0][1] if self.loss_curve else None

    @property
    def last_loss(self) -> float | None:
        return self.loss_curve[-1][1] if self.loss_curve else None


def render_texts(conversations: list[dict[str, Any]]) -> list[str]:
    """The conversations as template text: the tokenizer's training corpus."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from trajforge.models.tiny.template import CHAT_TEMPLATE

    return [
        render_jinja_template([c["messages"]], tools=c["tools"], chat_template=CHAT_TEMPLATE)[0][0]
        for c in conversations
    ]


def build_tiny(out: str | Path, config: BuildConfig | None = None) -> BuildReport:
    """Run the whole recipe and write the model directory ``out``; returns the report."""
    import torch

    from trajforge.models.tiny.tokenizer import train_tokenizer
    from trajforge.models.tiny.train import build_model, tokenize_conversations, train
    from trajforge.sandbox.types import SandboxConfig

    cfg = config or BuildConfig()
    out = Path(out)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    synth = asyncio.run(
        synthesize(
            cfg.examples, cfg.seed, families=cfg.families, sandbox=SandboxConfig(kind=cfg.sandbox_kind)
        )
    )
    if not synth.conversations:
        reasons = "; ".join(r for _, r in synth.rejected[:3])
        raise RuntimeError(f"no training trajectory passed its checker (first reasons: {reasons})")
    conversations = synth.conversations + copy_drills(cfg.drills, cfg.seed)
    seconds["data"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    tokenizer = train_tokenizer(render_texts(conversations), cfg.vocab_size)
    dataset, too_long = tokenize_conversations(conversations, tokenizer, cfg.train.max_length)
    seconds["tokenizer"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    model = build_model(tokenizer, cfg.shape, cfg.seed)
    with tempfile.TemporaryDirectory(prefix="trajforge-tiny-") as scratch:
        losses = train(model, tokenizer, dataset, cfg.train, scratch)
    seconds["train"] = time.perf_counter() - t2

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(out)  # type: ignore[arg-type]  # .to()'s decorator
    tokenizer.save_pretrained(out)
    seconds["total"] = time.perf_counter() - t0
    report = BuildReport(
        config=json.loads(json.dumps(asdict(cfg))),
        conversations=len(synth.conversations),
        drills=cfg.drills,
        rejected=synth.rejected,
        too_long=too_long,
        train_tokens=sum(len(x) for x in dataset["input_ids"]),
        assistant_tokens=sum(sum(m) for m in dataset["assistant_masks"]),
        parameters=sum(p.numel() for p in model.parameters()),
        weights_bytes=(out / "model.safetensors").stat().st_size,
        loss_curve=losses,
        seconds={k: round(v, 1) for k, v in seconds.items()},
    )
    (out / "recipe.json").write_text(report.model_dump_json(indent=2))
    return report


def _loss_summary(curve: list[tuple[int, float]]) -> str:
    if not curve:
        return "no loss logged"
    picks = sorted({0, len(curve) // 4, len(curve) // 2, (3 * len(curve)) // 4, len(curve) - 1})
    return ", ".join(f"step {curve[i][0]}: {curve[i][1]:.3f}" for i in picks)


def write_model_card(out: str | Path, report: BuildReport, quality: Any | None = None) -> Path:
    """Write ``README.md`` in the model directory: purpose, limits, recipe and measured numbers."""
    cfg = report.config
    shape, tr = cfg["shape"], cfg["train"]
    lines = [
        "# trajforge-tiny: the embedded tool-calling policy",
        "",
        f"A ~{report.parameters / 1e6:.1f}M-parameter Qwen2-architecture decoder trained from scratch by trajforge's own recipe "
        "(`trajforge model build-tiny`). It speaks ChatML with Hermes tool calls "
        '(`<think>` reasoning, then `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), '
        "calls `terminal` and `write_file`, reads the tool result and answers.",
        "",
        "## What it is for",
        "- **Demos** (`make demo`): the factory runs end to end on a fresh machine with no download and no API key.",
        "- **Tests**: a real transformer behind `trajforge serve`, so the server, the token-exact client and the",
        "  batch factory are tested against real generation, not a mock.",
        "- **RL on CPU**: its success rate leaves room to grow, so a GRPO run on a laptop can show improvement.",
        "",
        "## What it is not",
        "It knows only the five task shapes it was trained on (multi-digit + - * in the terminal, writing a",
        "given text to a file, counting the lines or words of a file, finding a key's value in a file), each",
        "solved with one tool call. Anything else gets a confident, wrong imitation of those. For real work point",
        "trajforge at a real endpoint: `trajforge run --base-url http://host:8000/v1 --model NAME` (any",
        "OpenAI-compatible server: vLLM, SGLang, llama.cpp, OpenRouter, ...).",
        "",
        "## Recipe",
        f"- Data: {report.conversations} synthetic trajectories from the seeded generators in `trajforge.tasks`",
        f"  (families {', '.join(cfg['families'])}; seed {cfg['seed']}); every tool call was executed by",
        f"  trajforge's real tools in a `{cfg['sandbox_kind']}` sandbox and kept only if the task's checker",
        f"  accepted the answer built from the real output ({len(report.rejected)} rejected); plus "
        f"{report.drills} short copy drills",
        '  ("Repeat exactly: <random value>" -> the value), so that copying values is what lowers the loss.',
        f"- Tokenizer: byte-level BPE trained to vocab <= {cfg['vocab_size']}; digits one per token and every space its own",
        "  token, so a copied value is the same token ids wherever it appears; ChatML/Hermes tokens.",
        f"- Model: Qwen2, {shape['num_layers']} layers, hidden {shape['hidden_size']}, {shape['num_heads']} heads "
        f"({shape['num_kv_heads']} KV), MLP {shape['intermediate_size']}, tied embeddings; "
        f"{report.parameters:,} parameters, {report.weights_bytes / 1e6:.1f} MB fp32 safetensors.",
        f"- SFT with TRL `SFTTrainer`, assistant-only loss: {tr['steps']} steps, batch {tr['batch_size']}, "
        f"lr {tr['learning_rate']} (warmup {tr['warmup_ratio']:.0%}, constant, linear decay over the last "
        f"{tr.get('decay_ratio', 0):.0%}), fp32, {report.train_tokens:,} tokens ({report.assistant_tokens:,} trained).",
        f"- Loss: {_loss_summary(report.loss_curve)}.",
        f"- Wall time (2 shared CPU cores): {report.seconds}.",
    ]
    if quality is not None:
        lines += [
            "",
            "## Measured quality",
            f"{quality.n_tasks} held-out tasks (seed {quality.seed}), real agent loop + tools + "
            f"sandbox, {quality.decoding} decoding:",
            f"- well-formed assistant turns: {quality.well_formed_rate:.1%} "
            f"({quality.well_formed_turns}/{quality.assistant_turns})",
            f"- task success: {quality.success_rate:.1%} ("
            + ", ".join(f"{k} {v:.0%}" for k, v in quality.success_by_family.items())
            + ")",
        ]
        if quality.success_rate < 0.2:
            lines += [
                "",
                "**Status: below target.** This build learned the call format and is starting to copy single",
                "word values (file names, keys, `lines`/`words`) from the prompt, but not yet digit strings, so",
                "most answers carry plausible but wrong numbers and texts and rewards are mostly zero. Copying",
                "emerges late in training (teacher-forced probes: first word copies near the end of the 1000",
                "steps); train longer (`--steps`) on a quieter machine, then re-measure with `trajforge model eval`.",
            ]
    lines += [
        "",
        "Rebuild: `trajforge model build-tiny --model-path DIR` (see `recipe.json` for the exact settings).",
    ]
    path = Path(out) / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path
