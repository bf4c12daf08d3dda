"""CPU of one non-streamed model call: our client (the openai SDK over its aiohttp transport) against
the same request posted with aiohttp alone, as the baseline of the same run.

The scripted endpoint runs in its own process at 0 latency (``_endpoint.py``); this process keeps
``--in-flight`` calls going and measures its main thread's CPU (``time.thread_time``) over
``--calls`` calls, alternating the two clients ``--rounds`` times so that both see the same
machine. Both send the same body (a system prompt, a tool call and its result, one tool) and turn
the answer into an ``AssistantTurn`` the same way; what differs is the SDK's layers (its request
options, httpx's request and response objects, the httpx-to-aiohttp adapter, our retry wrapper).

Prints the median CPU per call of each and their ratio; the difference times the model calls per
trajectory is what the SDK costs a rollout (docs/benchmarks.md, "the host process").

    .venv/bin/python benchmarks/model_client_cpu.py --calls 1500 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import scripted_endpoint  # noqa: E402

from trajforge.llm.chat_wire import build_request_body, turn_from_payload  # noqa: E402
from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig  # noqa: E402

_SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 20}
_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "echo hi"}'},
        }
    ],
}
_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"output": "hi\\n", "exit_code": 0}'}
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a command. " * 10,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


async def _measure(base_url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    model = OpenAIChatModel(OpenAIModelConfig(base_url=base_url, model="scripted", api_key_env=None))
    session = aiohttp.ClientSession()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer unused"}
    slots = asyncio.Semaphore(args.in_flight)

    async def one(i: int, client: str) -> None:
        messages: list[dict[str, Any]] = [_SYSTEM, {"role": "user", "content": f"task {i}"}, _CALL, _RESULT]
        async with slots:
            if client == "sdk":
                await model.complete(messages, _TOOLS)
                return
            body = build_request_body(model.config, messages, _TOOLS, None)
            async with session.post(
                f"{base_url}/chat/completions", data=orjson.dumps(body), headers=headers
            ) as r:
                r.raise_for_status()
                turn_from_payload(orjson.loads(await r.read()), model.config.model)

    cpu: dict[str, list[float]] = {"sdk": [], "aiohttp": []}
    try:
        for client in cpu:  # warm both (connections, first-call imports)
            await asyncio.gather(*(one(i, client) for i in range(200)))
        for _ in range(args.rounds):
            for client, runs in cpu.items():
                started = time.thread_time()
                await asyncio.gather(*(one(i, client) for i in range(args.calls)))
                runs.append((time.thread_time() - started) / args.calls * 1000)
    finally:
        await model.aclose()
        await session.close()
    return cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=1500, help="calls per client per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--in-flight", type=int, default=64)
    args = p.parse_args()
    with scripted_endpoint(0.0, prefix="tf-client-cpu-") as endpoint:
        cpu = asyncio.run(_measure(endpoint.base_url, args))
    sdk, bare = statistics.median(cpu["sdk"]), statistics.median(cpu["aiohttp"])
    result = {
        "calls_per_round": args.calls,
        "rounds": args.rounds,
        "in_flight": args.in_flight,
        "sdk_ms_per_call": round(sdk, 3),
        "aiohttp_alone_ms_per_call": round(bare, 3),
        "ratio": round(sdk / bare, 2),
        "sdk_layers_ms_per_call": round(sdk - bare, 3),
        "rounds_ms": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
    }
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
