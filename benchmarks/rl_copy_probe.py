"""How much direct supervision does the embedded policy need before it copies a value it fails on?

Why: the closed-loop demo (docs/benchmarks.md) cannot move write_file / find_value. Both fail on
one copied token (the first word of the text; the key to grep). This probe removes RL from the
question: it trains the embedded policy by plain supervised steps on the tiny_tasks reference
trajectories (the oracle's conversations, run by the real tools in bubblewrap and rendered by the
policy's own template: exactly the guided samples of ``rl train --guide oracle``), fresh items
every step, and reports per family the share of held-out items whose every assistant token is the
model's argmax under teacher forcing (a close proxy for greedy success). If the copy needs N
updates at learning rate X even with a label on every step, 20 minutes of CPU RL (~50-70
steps, a few guided samples of a family per step) cannot reach it.

    python benchmarks/rl_copy_probe.py --train write_file --lr 1e-3 --batch 8 --updates 100
    python benchmarks/rl_copy_probe.py --train write_file,write_file,arithmetic,count_lines,count_words \
        --lr 1e-3 --batch 10 --updates 150
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trajforge.endpoint import embedded_weights
from trajforge.llm.chat_template import ChatTemplate
from trajforge.models.tiny.data import solve_in_sandbox
from trajforge.rl.grpo import Sample, collate, token_logprobs
from trajforge.rl.guide import oracle_trace
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tasks import HELD_OUT_SEED, POLICY_FAMILIES, Task, generate, setup_task
from trajforge.tools.base import ToolContext
from trajforge.tools.registry import default_registry


async def conversations(tasks: list[Task]) -> list[list[dict[str, Any]]]:
    """Each task's reference solution, run by the real tools in its own bwrap sandbox."""
    registry = default_registry()
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    out = []
    try:
        for task in tasks:
            sandbox = await factory.create(task.id)
            try:
                await setup_task(task, sandbox)
                ctx = ToolContext(task_id=task.id, sandbox=sandbox)
                messages = await solve_in_sandbox(task, registry, ctx)
            finally:
                await sandbox.close()
            out.append([{"role": "user", "content": task.prompt}, *messages])
    finally:
        await close_factory(factory)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default="write_file", help="comma list of families, repeated = weighted")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--held-out", type=int, default=24, help="held-out items per family")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument(
        "--decay", type=float, default=0.0, help="linear lr decay to 0 over this last share of updates"
    )
    ap.add_argument("--save", type=Path, default=None, help="write the trained model + tokenizer here")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    weights = embedded_weights()
    tokenizer = AutoTokenizer.from_pretrained(weights)
    model = AutoModelForCausalLM.from_pretrained(weights)
    template = ChatTemplate(tokenizer, end_of_turn="<|im_end|>")
    registry = default_registry()
    schemas = registry.schemas(registry.for_toolsets(["terminal", "file"]))

    def samples(convs: list[list[dict[str, Any]]]) -> list[Sample]:
        out = []
        for conv in convs:
            tokens, sampled = oracle_trace(conv, template, schemas)
            out.append(Sample(tokens, sampled, [0.0] * len(tokens), 1.0))
        return out

    mix = args.train.split(",")
    n = args.batch * args.updates
    train_tasks = [generate(mix[i % len(mix)], 1, seed=777 + i)[0] for i in range(n)]
    train = samples(asyncio.run(conversations(train_tasks)))
    held = {
        f: samples(asyncio.run(conversations(generate(f, args.held_out, seed=HELD_OUT_SEED))))
        for f in POLICY_FAMILIES
    }

    def all_argmax(group: list[Sample]) -> float:
        batch = collate(group, 0)
        with torch.no_grad():
            logits = model.eval()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[
                :, :-1
            ]
        right = (logits.argmax(-1) == batch.input_ids[:, 1:]).float() * batch.loss_mask
        return float((right.sum(1) == batch.loss_mask.sum(1)).float().mean())

    def report(k: int, began: float) -> None:
        cells = " ".join(f"{f}={all_argmax(h):.2f}" for f, h in held.items())
        print(f"update {k:4d} samples {k * args.batch:5d} {cells} [{time.time() - began:.0f}s]", flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    began = time.time()
    report(0, began)
    decay_from = int(args.updates * (1 - args.decay))
    for k in range(args.updates):
        if k >= decay_from:  # warmup-stable-decay, as the embedded policy's own recipe
            for group in optimizer.param_groups:
                group["lr"] = args.lr * (args.updates - k) / max(1, args.updates - decay_from)
        model.train()
        batch = collate(train[k * args.batch : (k + 1) * args.batch], 0)
        lp, _ = token_logprobs(model, batch)
        loss = -(lp * batch.loss_mask).sum() / batch.loss_mask.sum()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (k + 1) % args.every == 0:
            report(k + 1, began)
    if args.save is not None:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
        print(f"saved to {args.save}")


if __name__ == "__main__":
    main()
