"""Tokenize the synthetic trajectories and train the tiny decoder with TRL's SFTTrainer.

The dataset is tokenized here, through the chat template's ``{% generation %}`` blocks, into
``input_ids`` + ``assistant_masks``; TRL then trains on assistant tokens only (the prompt, the
tool list and the tool outputs are context, not targets). Tokenizing ourselves also keeps
tool-call arguments as exact JSON strings (an Arrow column of message dicts would merge the
argument keys of different tools into one struct and render ``null``s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM, TrainerCallback

from trajforge.models.tiny.template import CHAT_TEMPLATE


@dataclass(frozen=True)
class ModelShape:
    """Size of the decoder. The defaults give ~0.9M parameters (~3.5 MB in fp32)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_positions: int = 1024


@dataclass(frozen=True)
class TrainSettings:
    """SFT hyperparameters (TRL ``SFTConfig`` fields of the same meaning)."""

    steps: int = 2000
    batch_size: int = 16
    learning_rate: float = 1.5e-3
    warmup_ratio: float = 0.03
    decay_ratio: float = 0.2
    """Constant LR after warmup, linear decay over the last ``decay_ratio`` of the steps
    (warmup-stable-decay): copying appears late, so the LR must stay high until then."""
    max_length: int = 512
    seed: int = 0
    logging_steps: int = 10


@dataclass
class LossLog(TrainerCallback):
    """Collects (step, loss) pairs as the trainer logs them."""

    points: list[tuple[int, float]] = field(default_factory=list)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if logs and "loss" in logs:
            self.points.append((state.global_step, float(logs["loss"])))


def build_model(tokenizer: PreTrainedTokenizerBase, shape: ModelShape, seed: int = 0) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2-architecture decoder sized for ``tokenizer``."""
    import torch

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tokenize_conversations(
    conversations: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> tuple[Dataset, int]:
    """``input_ids`` + ``assistant_masks`` rows; returns the dataset and how many were too long."""
    rows: dict[str, list[list[int]]] = {"input_ids": [], "assistant_masks": []}
    too_long = 0
    for conv in conversations:
        out: Any = tokenizer.apply_chat_template(  # a BatchEncoding (return_dict=True)
            conv["messages"],
            tools=conv.get("tools"),
            chat_template=CHAT_TEMPLATE,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        if len(out["input_ids"]) > max_length:
            too_long += 1
            continue
        rows["input_ids"].append(list(out["input_ids"]))
        rows["assistant_masks"].append(list(out["assistant_masks"]))
    return Dataset.from_dict(rows), too_long


def train(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    settings: TrainSettings,
    output_dir: str,
    callbacks: Sequence[TrainerCallback] = (),
) -> list[tuple[int, float]]:
    """Run SFT in place on ``model``; returns the logged loss curve.

    ``callbacks`` are extra transformers ``TrainerCallback``s (e.g. a held-out copy-accuracy probe).
    """
    from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

    config = SFTConfig(
        output_dir=output_dir,
        max_steps=settings.steps,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={
            "num_decay_steps": int(settings.steps * settings.decay_ratio),
            "decay_type": "linear",
        },
        warmup_steps=max(1, int(settings.steps * settings.warmup_ratio)),
        weight_decay=0.01,
        max_length=settings.max_length,
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to=[],
        seed=settings.seed,
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16 autocast; the copy signal is small, keep fp32
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    losses = LossLog()
    # The loss is on every token, as the committed weights were trained: the tiny model learns the
    # values it must copy (digits, names) from the prompts and tool outputs too. TRL >= 1.16 masks
    # the loss to ``assistant_masks`` whenever that column is present (earlier versions only with
    # ``assistant_only_loss``), which left the mini recipe unable to copy a 6-digit number; the mask
    # stays in the dataset for the build report's counts, not for the trainer.
    if "assistant_masks" in dataset.column_names:
        dataset = dataset.remove_columns("assistant_masks")
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[losses, *callbacks],
    )
    trainer.train()
    return losses.points
