"""trajforge against the inference servers people run (issue 37): the same checks, one table.

Each server serves the embedded tiny policy; against each (``--temperature``, default greedy):

  batch   ``trajforge batch`` over N tiny_tasks rows (``--env tiny_tasks``): completed, solved, tool
          calls the model wrote / ran / were recovered from text, the dialect preflight chose
  eval    ``trajforge env eval tiny_tasks`` over M items: solved
  token   the token-exact path (``--tokenizer``) over the same rows, greedy: tokens equal to
          ``trajforge serve``'s and the worst logprob difference -- or how preflight refused it
  reload  the server's weight reload: the recipe's weights in (the next greedy answer changes),
          the committed ones back (it comes back) -- where the server has a reload route

Servers: ``trajforge`` (``trajforge serve``, the yardstick: always run first), ``llama-server`` and
``llama-cpp-python`` (CPU; built by ``make llamacpp``), ``vllm`` and ``sglang`` (a CUDA GPU;
``--install`` puts their wheels in a virtualenv of their own, ``.venv-gpu-servers``, from the
package index). Without a GPU the GPU servers are refused before anything starts, saying so.

    python benchmarks/servers.py --servers trajforge,llama-server,llama-cpp-python --rows 30
    python benchmarks/servers.py --servers trajforge,vllm,sglang --install --rows 30     # GPU machine
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # llamacpp.py: where the llama.cpp builds are, how to serve them

CPU_SERVERS = ("trajforge", "llama-server", "llama-cpp-python")
GPU_SERVERS = ("vllm", "sglang")
GPU_VENV = REPO / ".venv-gpu-servers"
GPU_WHEELS = {"vllm": "vllm", "sglang": "sglang[all]"}
SERVED = "tiny"


@dataclass
class Row:
    """One server's line of the table."""

    server: str
    dialect: str = ""
    batch: str = ""
    tool_calls: str = ""
    eval: str = ""
    token: str = ""
    reload: str = ""
    notes: list[str] = field(default_factory=list)


# -- serving --------------------------------------------------------------------------------------


@dataclass
class Served:
    base_url: str  # .../v1
    reload: Any = None  # async (path) -> str, or None: no reload route


def _gpu_problem() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi not found): vLLM and SGLang need CUDA"
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if done.returncode != 0 or "GPU" not in done.stdout:
        return f"nvidia-smi lists no GPU: {done.stderr.strip() or done.stdout.strip()}"
    return None


def install_gpu_servers(names: list[str]) -> None:
    """vLLM and SGLang in a virtualenv of their own (their torch/CUDA pins clash with ours)."""
    if not (GPU_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(GPU_VENV)], check=True)
    pip = [str(GPU_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    for name in names:
        subprocess.run([*pip, GPU_WHEELS[name]], check=True)


async def _post_json(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers or {}) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


@contextlib.asynccontextmanager
async def serve(name: str, logs: Path) -> AsyncIterator[Served]:
    """Serve the embedded policy with ``name``; the launch commands are docs/servers.md's."""
    import llamacpp
    from trajforge.endpoint import embedded_weights

    weights = embedded_weights()
    port = llamacpp.free_port()
    common = ["--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    if name == "trajforge":
        from trajforge.serve.launcher import LocalServer

        async with LocalServer(weights, extra_args=("--served-model-name", SERVED)) as server:

            async def reload(path: Path) -> str:
                status, body = await _post_json(
                    f"{server.base_url}/v1/load_weights", {"path": str(path)}, server.auth_headers()
                )
                return f"version {body.get('version')}" if status == 200 else f"HTTP {status}: {body}"

            yield Served(server.openai_base_url, reload)
    elif name in ("llama-server", "llama-cpp-python"):
        with llamacpp.serve(name, logs) as url:
            yield Served(url)  # neither loads new weights into a running server
    elif name == "vllm":
        python = str(GPU_VENV / "bin" / "python")
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(weights), *common]
        argv += ["--max-model-len", "1024", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        argv += ["--reasoning-parser", "deepseek_r1", "--enforce-eager", "--gpu-memory-utilization", "0.3"]
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")  # /collective_rpc, for the reload check
        with llamacpp.running(
            argv, f"http://127.0.0.1:{port}/health", logs / "vllm.log", env=env, ready_s=600
        ):

            async def reload(path: Path) -> str:
                root = f"http://127.0.0.1:{port}"
                status, body = await _post_json(
                    f"{root}/collective_rpc",
                    {"method": "update_config", "args": [{"model_config": {"model": str(path)}}]},
                )
                if status != 200:
                    return f"HTTP {status}: {body}"
                status, body = await _post_json(f"{root}/collective_rpc", {"method": "reload_weights"})
                return "reloaded" if status == 200 else f"HTTP {status}: {body}"

            yield Served(f"http://127.0.0.1:{port}/v1", reload)
    elif name == "sglang":
        python = str(GPU_VENV / "bin" / "python")
        argv = [python, "-m", "sglang.launch_server", "--model-path", str(weights), *common]
        argv += [
            "--context-length",
            "1024",
            "--tool-call-parser",
            "qwen25",
            "--reasoning-parser",
            "deepseek-r1",
        ]
        argv += ["--mem-fraction-static", "0.3"]
        with llamacpp.running(argv, f"http://127.0.0.1:{port}/health", logs / "sglang.log", ready_s=600):

            async def reload(path: Path) -> str:
                status, body = await _post_json(
                    f"http://127.0.0.1:{port}/update_weights_from_disk", {"model_path": str(path)}
                )
                return "reloaded" if status == 200 and body.get("success") else f"HTTP {status}: {body}"

            yield Served(f"http://127.0.0.1:{port}/v1", reload)
    else:
        raise ValueError(f"unknown server {name!r}; choose from {', '.join(CPU_SERVERS + GPU_SERVERS)}")


# -- the checks -----------------------------------------------------------------------------------


async def _batch(
    dataset: Path, out: Path, name: str, base_url: str | None, temperature: float, **settings: Any
) -> list[dict[str, Any]]:
    import llamacpp

    return await llamacpp.tiny_tasks_batch(dataset, out, name, base_url, temperature=temperature, **settings)


def _calls(line: dict[str, Any]) -> int:
    return sum(len(m.get("tool_calls") or ()) for m in line["messages"] if m["role"] == "assistant")


async def check_batch(row: Row, dataset: Path, out: Path, served: Served, temperature: float) -> None:
    from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig

    probe = OpenAIChatModel(OpenAIModelConfig(base_url=served.base_url, model=SERVED, api_key_env=None))
    try:
        dialect = await probe.dialect()
        row.dialect = f"{dialect.name} ({probe.server.evidence if probe.server else ''})"
    finally:
        await probe.aclose()
    lines = await _batch(dataset, out, f"{row.server}-batch", served.base_url, temperature)
    done = sum(line["status"] == "completed" for line in lines)
    solved = sum(line.get("reward") == 1.0 for line in lines)
    written = sum(_calls(line) for line in lines)
    ran = sum(sum(s["count"] for s in line["tool_stats"].values()) for line in lines)
    recovered = sum(len(line.get("recovered_calls") or ()) for line in lines)
    row.batch = f"{done}/{len(lines)} completed, {solved} solved"
    row.tool_calls = f"{written} written, {ran} run, {recovered} recovered from text"


async def check_eval(row: Row, out: Path, served: Served, items: int, temperature: float) -> None:
    from trajforge.endpoint import EndpointConfig
    from trajforge.envs import load_env, run_eval
    from trajforge.envs.running.backends import open_rollout_backends

    env = load_env("tiny_tasks", {"agent_temperature": temperature})
    endpoint = EndpointConfig(model=SERVED, base_url=served.base_url)
    run_dir = out / f"{row.server}-eval"
    async with open_rollout_backends(env, endpoint, "model") as backends:
        await run_eval(env, backends, run_dir, n=items, group_size=1, agent="model")
    episodes = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines() if x.strip()]
    solved = sum(e.get("reward") == 1.0 for e in episodes)
    row.eval = f"{solved}/{len(episodes)} solved"


async def check_token(
    row: Row, dataset: Path, out: Path, served: Served, reference: list[dict[str, Any]]
) -> None:
    from trajforge.batch.errors import RunError
    from trajforge.endpoint import embedded_weights

    try:
        lines = await _batch(
            dataset, out, f"{row.server}-token", served.base_url, 0.0, tokenizer=str(embedded_weights())
        )
    except RunError as exc:  # refused at preflight: say how
        text = str(exc)
        row.token = f"refused at preflight: {text[:90]} ... {text[-150:]}"
        return
    same, worst = 0, 0.0
    for line, ref in zip(lines, reference, strict=True):
        if line.get("trace") and ref.get("trace") and line["trace"]["tokens"] == ref["trace"]["tokens"]:
            same += 1
            worst = max(
                worst,
                *(
                    abs(a - b)
                    for a, b in zip(line["trace"]["logprobs"], ref["trace"]["logprobs"], strict=True)
                ),
            )
    row.token = f"{same}/{len(lines)} rows token-identical, worst |dlogprob| {worst:.1e}"


async def check_reload(row: Row, served: Served) -> None:
    from trajforge.endpoint import embedded_weights, recipe_weights
    from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig
    from trajforge.llm.types import SamplingParams

    if served.reload is None:
        row.reload = "no reload route"
        return
    model = OpenAIChatModel(OpenAIModelConfig(base_url=served.base_url, model=SERVED, api_key_env=None))
    ask = [{"role": "user", "content": "What is 455 * 39? Use the terminal."}]
    greedy = SamplingParams(temperature=0.0, max_tokens=64)
    try:
        before = (await model.complete(ask, sampling=greedy)).model_dump(
            include={"content", "reasoning", "tool_calls"}
        )
        swapped = await served.reload(recipe_weights())
        during = (await model.complete(ask, sampling=greedy)).model_dump(
            include={"content", "reasoning", "tool_calls"}
        )
        back = await served.reload(embedded_weights())
        after = (await model.complete(ask, sampling=greedy)).model_dump(
            include={"content", "reasoning", "tool_calls"}
        )
    finally:
        await model.aclose()
    row.reload = (
        f"in: {swapped}, answer changed: {during != before}; back: {back}, answer restored: {after == before}"
    )


# -- the run --------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, work: Path) -> list[Row]:
    import orjson

    from trajforge.tasks import generate_mixed
    from trajforge.tasks.generate import POLICY_FAMILIES

    dataset = work / "tasks.jsonl"
    rows_data = [t.to_row() for t in generate_mixed(POLICY_FAMILIES, args.rows, seed=args.seed)]
    dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows_data))
    # trajforge serve's tokens, greedy: what every token-exact path must give
    reference = await _batch(dataset, work, "reference-token", None, 0.0, tokenizer="auto")
    table = []
    for name in args.servers:
        row = Row(name)
        table.append(row)
        try:
            async with serve(name, work) as served:
                await check_batch(row, dataset, work, served, args.temperature)
                await check_eval(row, work, served, args.eval_items, args.temperature)
                await check_token(row, dataset, work, served, reference)
                await check_reload(row, served)
        except Exception as exc:  # one server failing does not hide the others' lines
            row.notes.append(f"{type(exc).__name__}: {str(exc)[:300]}")
        print(json.dumps(row.__dict__), file=sys.stderr, flush=True)
    return table


def print_table(rows: list[Row]) -> None:
    cols = ("server", "dialect", "batch", "tool_calls", "eval", "token", "reload", "notes")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        values = [getattr(row, c) if c != "notes" else "; ".join(row.notes) for c in cols]
        print("| " + " | ".join(str(v).replace("|", "/") for v in values) + " |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--servers",
        default=",".join(CPU_SERVERS),
        help=f"comma-separated: {', '.join(CPU_SERVERS + GPU_SERVERS)}",
    )
    p.add_argument("--rows", type=int, default=30, help="tiny_tasks rows of the batch and token checks")
    p.add_argument("--eval-items", type=int, default=10, help="items of the env eval check")
    p.add_argument("--seed", type=int, default=37, help="seeds the rows")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default greedy)")
    p.add_argument(
        "--install", action="store_true", help="pip-install vLLM/SGLang into .venv-gpu-servers first"
    )
    p.add_argument("--out", default=None, help="working directory (default: a new temporary one)")
    args = p.parse_args(argv)
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in args.servers if s not in CPU_SERVERS + GPU_SERVERS]
    if unknown:
        p.error(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(CPU_SERVERS + GPU_SERVERS)}")
    gpu = [s for s in args.servers if s in GPU_SERVERS]
    if gpu:
        problem = _gpu_problem()
        if problem:
            raise SystemExit(
                f"error: {', '.join(gpu)}: {problem}. Run the CPU servers here: --servers {','.join(CPU_SERVERS)}"
            )
        if args.install:
            install_gpu_servers(gpu)
        elif not (GPU_VENV / "bin" / "python").exists():
            raise SystemExit(
                f"error: {', '.join(gpu)} are not installed: add --install (a virtualenv at {GPU_VENV})"
            )
    work = Path(args.out or tempfile.mkdtemp(prefix="tf-servers-"))
    work.mkdir(parents=True, exist_ok=True)
    print_table(asyncio.run(run(args, work)))


if __name__ == "__main__":
    main()
