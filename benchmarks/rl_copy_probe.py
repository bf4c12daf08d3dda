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
    # a phased warm start (WarmStart.phases; implies --source env) from another model:
    python benchmarks/rl_copy_probe.py --model DIR --batch 10 --decay 0.1 \
        --phases "write_file@200;find_value@250;write_file,find_value,arithmetic,count_lines,count_words@200"
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
from trajforge.rl.config import TrainConfig, WarmPhase, WarmStart
from trajforge.rl.grpo import Sample, collate
from trajforge.rl.guide import oracle_trace
from trajforge.rl.warm_start import Demonstrations, collect_demonstrations, supervised_updates
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tasks import HELD_OUT_SEED, POLICY_FAMILIES, Task, generate, setup_task
from trajforge.tools.base import ToolContext
from trajforge.tools.builtin import default_registry


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


async def env_demonstrations(cfg: TrainConfig, template: ChatTemplate) -> list[Demonstrations]:
    """Each warm-start phase's demonstrations, as ``rl train`` collects them."""
    assert cfg.warm_start is not None
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    try:
        return [
            await collect_demonstrations(
                cfg, p.updates * cfg.warm_start.batch, factory, default_registry(), template, phase=i
            )
            for i, p in enumerate(cfg.warm_start.schedule())
        ]
    finally:
        await close_factory(factory)


def parse_phases(spec: str) -> list[WarmPhase]:
    """``"a,b@N;c@M"`` -> two phases: N updates on families a and b, then M on c."""
    out = []
    for part in spec.split(";"):
        families, _, updates = part.rpartition("@")
        if not families or not updates.isdigit():
            raise SystemExit(f"--phases: {part!r} is not FAMILY[,FAMILY...]@UPDATES")
        out.append(WarmPhase(updates=int(updates), env_overrides={"families": families.split(",")}))
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
    ap.add_argument(
        "--source",
        choices=("data", "env"),
        default="data",
        help="data: the embedded policy's own SFT synthesis; env: the tiny_tasks env's oracle episodes",
    )
    ap.add_argument("--focal", type=float, default=0.0, help="WarmStart.focal: (1-p)^g token weights")
    ap.add_argument("--seed", type=int, default=0, help="shifts the training items (and torch's seed)")
    ap.add_argument(
        "--phases",
        default=None,
        help="FAMILY[,FAMILY...]@UPDATES;... : a phased warm start in place of --train/--updates (env items)",
    )
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded policy)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    weights = str(args.model) if args.model else embedded_weights()
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
    ws_fields: dict[str, Any] = dict(batch=args.batch, lr=args.lr, decay=args.decay, focal=args.focal)
    if args.phases:
        ws = WarmStart(**ws_fields, phases=parse_phases(args.phases))
    else:
        ws = WarmStart(**ws_fields, updates=args.updates)
    if args.source == "env" or args.phases:  # what `rl train`'s warm_start trains on (rl/warm_start.py)
        cfg = TrainConfig(
            env="tiny_tasks",
            model=weights,
            seed=args.seed,
            env_overrides={"families": mix},
            warm_start=ws,
        )
        train = [d.samples for d in asyncio.run(env_demonstrations(cfg, template))]
    else:
        train_tasks = [generate(mix[i % len(mix)], 1, seed=777 + args.seed + i)[0] for i in range(n)]
        train = [samples(asyncio.run(conversations(train_tasks)))]
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

    began = time.time()
    report(0, began)

    def every(k: int, _loss: float) -> None:
        if k % args.every == 0:
            report(k, began)

    supervised_updates(model, train, ws, micro_batch=args.batch, pad_id=0, device="cpu", on_update=every)
    if args.save is not None:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
        print(f"saved to {args.save}")


if __name__ == "__main__":
    main()
