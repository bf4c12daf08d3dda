"""Command line of the scripted server: ``python -m trajforge.testing.server_cli``.

Serves a ready-made policy with optional injected faults until SIGINT/SIGTERM; prints
``READY <base_url>`` once listening and ``STATS <counters as JSON>`` on the way out (the
benchmarks read both).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

import orjson

from trajforge.testing.policies import POLICIES, echo_policy, tool_then_answer
from trajforge.testing.replies import FaultConfig, PolicyFn, ReasoningField
from trajforge.testing.scripted_server import ScriptedServer


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trajforge.testing.server_cli",
        description="Scripted OpenAI-compatible endpoint on loopback, for benchmarks and tests.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to every chat request")
    p.add_argument("--policy", choices=sorted(POLICIES), default="tool_then_answer")
    p.add_argument("--model", default="scripted")
    _add_policy_args(p)
    p.add_argument("--api-key-env", default=None, help="require the key held in this environment variable")
    _add_fault_args(p)
    p.add_argument("--port-file", default=None, help="also write the port number to this file")
    return p.parse_args(argv)


def _add_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls-per-sample", type=int, default=2, help="tool_then_answer: tool calls per sample")
    p.add_argument("--tool", default="terminal", help="tool_then_answer: the tool to call")
    p.add_argument("--command", default="echo hi", help="tool_then_answer: the terminal command")
    p.add_argument("--answer", default="done", help="tool_then_answer: the final answer")
    p.add_argument("--reasoning-field", default="reasoning_content", choices=get_args(ReasoningField))


def _add_fault_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--p-500", type=float, default=0.0)
    p.add_argument("--p-429", type=float, default=0.0)
    p.add_argument("--retry-after", type=float, default=1.0)
    p.add_argument("--p-timeout", type=float, default=0.0)
    p.add_argument("--timeout-hang", type=float, default=5.0)
    p.add_argument("--p-malformed", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)


def _policy_from_args(args: argparse.Namespace) -> PolicyFn:
    if args.policy == "echo":
        return echo_policy
    return tool_then_answer(
        calls_per_sample=args.calls_per_sample,
        tool=args.tool,
        command=args.command,
        answer=args.answer,
        reasoning_field=args.reasoning_field,
    )


def _faults_from_args(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig(
        p_500=args.p_500,
        p_429=args.p_429,
        retry_after_s=args.retry_after,
        p_timeout=args.p_timeout,
        timeout_hang_s=args.timeout_hang,
        p_malformed=args.p_malformed,
        seed=args.seed,
    )


def _api_key_from_args(args: argparse.Namespace) -> str | None:
    """The key named by ``--api-key-env`` (never the key itself on the command line)."""
    if not args.api_key_env:
        return None
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
        raise SystemExit(f"error: environment variable {args.api_key_env} is empty or unset")
    return api_key


def _server_from_args(args: argparse.Namespace) -> ScriptedServer:
    faults = _faults_from_args(args)
    api_key = _api_key_from_args(args)
    return ScriptedServer(
        _policy_from_args(args),
        faults=faults,
        latency_s=args.latency,
        model=args.model,
        host=args.host,
        port=args.port,
        api_key=api_key,
        keep_requests=False,
    )


async def _serve_forever(args: argparse.Namespace) -> None:
    server = _server_from_args(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        if args.port_file:
            await asyncio.to_thread(Path(args.port_file).write_text, f"{server.port}\n")
        print(f"READY {server.base_url}", flush=True)
        await stop.wait()
    print(f"STATS {orjson.dumps(dict(server.counters)).decode()}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(_serve_forever(_parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
