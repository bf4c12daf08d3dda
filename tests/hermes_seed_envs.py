"""Env files written in the seed system's style, one per kind of env Hermes Agent ships.

Each is what a Hermes Agent user writes: the seed's imports (``environments.hermes_base_env``,
``environments.agent_loop``, ``environments.tool_context``, ``tools.terminal_tool``,
atroposlib's ``APIServerConfig``/``EvalHandlingEnum``), a ``config_init()`` returning the config and
its server configs, the seed's config fields (``terminal_backend="modal"``,
``max_token_length``, ``tool_pool_size``, Atropos's ``use_wandb``/``total_steps``/...), its
hooks (``setup``, ``get_next_item``, ``format_prompt``, ``compute_reward``, ``evaluate``,
``wandb_log``, ``collect_trajectories``) and verbs (blocking ``ctx.terminal``/``upload_dir``/
``download_dir``, ``HermesAgentLoop``, ``ToolContext(task_id)``, ``self.server.chat_completion``,
``evaluate_log``). They are trajforge's own files, not copies of the seed's; the tasks are small
so a scripted model can solve them (tests/test_hermes_seed_kinds.py writes them into a checkout
layout, ``environments/...``, and runs each unchanged through ``trajforge env eval``).
"""

from __future__ import annotations

import textwrap

# --------------------------------------------------------------------------- terminal test
TERMINAL_TEST = textwrap.dedent(
    '''
    """Files at ~/ paths; the verifier cats them, as the seed's terminal test does."""
    import os
    from typing import Dict, List, Optional, Tuple

    from atroposlib.envs.server_handling.server_manager import APIServerConfig

    from environments.agent_loop import AgentResult
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
    from environments.tool_context import ToolContext

    TASKS = [
        {"prompt": "Put the text 'blue whale' into ~/notes/animal.txt", "verify_path": "~/notes/animal.txt",
         "expected": "blue whale"},
        {"prompt": "Put the text 'seven' into ~/number.txt", "verify_path": "~/number.txt", "expected": "seven"},
    ]


    class FileTasksConfig(HermesAgentEnvConfig):
        pass


    class FileTasksEnv(HermesAgentBaseEnv):
        name = "file-tasks"
        env_config_cls = FileTasksConfig

        @classmethod
        def config_init(cls) -> Tuple[FileTasksConfig, List[APIServerConfig]]:
            config = FileTasksConfig(
                enabled_toolsets=["terminal", "file"], disabled_toolsets=None, distribution=None,
                max_agent_turns=4, max_token_length=4096, agent_temperature=1.0,
                system_prompt="You have a terminal. Do what the user asks.",
                terminal_backend="modal", group_size=2, tokenizer_name="NousResearch/Hermes-3-Llama-3.1-8B",
                steps_per_eval=3, total_steps=3, use_wandb=True, wandb_name="file-tasks",
                ensure_scores_are_not_same=False, dataset_name=None,
            )
            servers = [APIServerConfig(base_url="https://openrouter.ai/api/v1", model_name="vendor/model",
                                       server_type="openai", api_key=os.getenv("OPENROUTER_API_KEY", ""),
                                       health_check=False)]
            return config, servers

        async def setup(self):
            self.tasks = list(TASKS)
            self.iter = 0
            self.rewards: List[float] = []

        async def get_next_item(self) -> Dict[str, str]:
            item = self.tasks[self.iter % len(self.tasks)]
            self.iter += 1
            return item

        def format_prompt(self, item: Dict[str, str]) -> str:
            return item["prompt"]

        async def compute_reward(self, item, result: AgentResult, ctx: ToolContext) -> float:
            got = ctx.terminal(f"cat {item['verify_path']}")
            score = 1.0 if got["exit_code"] == 0 and got["output"].strip() == item["expected"] else 0.0
            self.rewards.append(score)
            return score

        async def evaluate(self, *args, **kwargs):
            reply = await self.server.chat_completion(
                messages=[{"role": "user", "content": "ping"}], n=1, max_tokens=64, temperature=0.0, split="eval"
            )
            await self.evaluate_log(metrics={"eval/replies": len(reply.choices)}, samples=[])

        async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
            wandb_metrics = wandb_metrics or {}
            if self.rewards:
                wandb_metrics["train/avg_reward"] = sum(self.rewards) / len(self.rewards)
                self.rewards = []
            await super().wandb_log(wandb_metrics)


    if __name__ == "__main__":
        FileTasksEnv.cli()
    '''
)

# --------------------------------------------------------------------------- SWE
SWE = textwrap.dedent(
    '''
    """Coding tasks from a dataset; the verifier runs each row's test in /workspace."""
    from typing import Any, Dict, List, Optional, Tuple

    from atroposlib.envs.server_handling.server_manager import APIServerConfig
    from datasets import load_dataset

    from environments.agent_loop import AgentResult
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
    from environments.tool_context import ToolContext


    class CodeTasksConfig(HermesAgentEnvConfig):
        pass


    class CodeTasksEnv(HermesAgentBaseEnv):
        name = "code-tasks"
        env_config_cls = CodeTasksConfig

        @classmethod
        def config_init(cls) -> Tuple[CodeTasksConfig, List[APIServerConfig]]:
            config = CodeTasksConfig(
                enabled_toolsets=["terminal", "file"], disabled_toolsets=None, distribution=None,
                max_agent_turns=5, max_token_length=4096, terminal_backend="modal",
                dataset_name="example-org/code-tasks", dataset_split="test", prompt_field="prompt",
                group_size=1, tool_call_parser="hermes", steps_per_eval=50, total_steps=500,
                use_wandb=True, wandb_name="code-tasks",
            )
            servers = [APIServerConfig(base_url="http://localhost:8000/v1", model_name="vendor/coder",
                                       server_type="openai", api_key="")]
            return config, servers

        async def setup(self):
            self.dataset = load_dataset(self.config.dataset_name, split=self.config.dataset_split)
            self.iter = 0
            self.reward_buffer: List[float] = []

        async def get_next_item(self) -> Dict[str, Any]:
            item = self.dataset[self.iter % len(self.dataset)]
            self.iter += 1
            return item

        def format_prompt(self, item: Dict[str, Any]) -> str:
            return item.get(self.config.prompt_field, "") + f"\\n\\nTests to pass:\\n{item['test']}"

        async def compute_reward(self, item: Dict[str, Any], result: AgentResult, ctx: ToolContext) -> float:
            run = ctx.terminal(f'cd /workspace && python3 -c "{item["test"]}"', timeout=60)
            score = 1.0 if run["exit_code"] == 0 else 0.0
            self.reward_buffer.append(score)
            return score

        async def evaluate(self, *args, **kwargs):
            await self.evaluate_log(metrics={"eval/placeholder": 0.0})

        async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
            wandb_metrics = wandb_metrics or {}
            if self.reward_buffer:
                wandb_metrics["train/pass_rate"] = sum(self.reward_buffer) / len(self.reward_buffer)
                self.reward_buffer = []
            await super().wandb_log(wandb_metrics)
    '''
)

# --------------------------------------------------------------------------- on-policy distillation
OPD = textwrap.dedent(
    '''
    """Write a function, its test file, run the tests; an OPD pipeline over the rollouts."""
    import random
    import uuid
    from typing import Any, Dict, List, Optional, Tuple

    from pydantic import Field

    from atroposlib.envs.server_handling.server_manager import APIServerConfig

    from environments.agent_loop import AgentResult, HermesAgentLoop
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
    from environments.tool_context import ToolContext

    TASKS = [
        {"task": "Write `double(x)` returning 2 * x.",
         "test_code": "from solution import double\\nassert double(4) == 8\\nprint('tests passed')\\n"},
        {"task": "Write `shout(s)` returning s upper-cased with a '!' after it.",
         "test_code": "from solution import shout\\nassert shout('hi') == 'HI!'\\nprint('tests passed')\\n"},
        {"task": "Write `count_vowels(s)` counting a, e, i, o and u in s.",
         "test_code": "from solution import count_vowels\\nassert count_vowels('banana') == 3\\nprint('tests passed')\\n"},
    ]


    class CodeOPDConfig(HermesAgentEnvConfig):
        opd_enabled: bool = Field(default=True, description="distill from hindsight hints")
        distill_topk: int = Field(default=8, description="teacher logprobs per position")
        eval_size: int = Field(default=2, description="held-out tasks")


    class CodeOPDEnv(HermesAgentBaseEnv):
        name = "code-opd"
        env_config_cls = CodeOPDConfig
        default_toolsets = ["terminal", "file"]

        @classmethod
        def config_init(cls) -> Tuple[CodeOPDConfig, List[APIServerConfig]]:
            config = CodeOPDConfig(
                enabled_toolsets=["terminal", "file"], max_agent_turns=6, agent_temperature=1.0,
                system_prompt="Write solution.py and test_solution.py, then run the tests.",
                opd_enabled=True, distill_topk=8, group_size=2, total_steps=500, steps_per_eval=50,
                use_wandb=True, wandb_name="code-opd",
            )
            servers = [APIServerConfig(base_url="http://localhost:8000/v1", model_name="vendor/student",
                                       server_type="vllm")]
            return config, servers

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._items: list = []
            self._eval_items: list = []
            self._index = 0
            self._reward_buffer: list = []
            self._hints_buffer: list = []

        async def setup(self) -> None:
            items = [dict(t) for t in TASKS]
            random.Random(7).shuffle(items)
            self._items = items
            self._eval_items = items[: self.config.eval_size]

        async def get_next_item(self) -> dict:
            item = self._items[self._index % len(self._items)]
            self._index += 1
            return item

        def format_prompt(self, item: dict) -> str:
            return (f"## Task\\n{item['task']}\\n\\n## Tests\\n```python\\n{item['test_code']}```\\n"
                    "Write solution.py and test_solution.py, then run python test_solution.py.")

        async def compute_reward(self, item: dict, result: AgentResult, ctx: ToolContext) -> float:
            run = ctx.terminal("python test_solution.py 2>&1", timeout=30)
            used = {tc.get("function", {}).get("name") for m in result.messages if m.get("role") == "assistant"
                    for tc in (m.get("tool_calls") or []) if isinstance(tc, dict)}
            passed = run["exit_code"] == 0 and "passed" in run["output"].lower()
            reward = 1.0 if passed and "write_file" in used else 0.0
            self._reward_buffer.append(reward)
            return reward

        async def collect_trajectories(self, item):
            scored, backlog = await super().collect_trajectories(item)
            if self.config.opd_enabled and scored is not None and self._use_managed_server():
                await self._distill(scored)
            return scored, backlog

        async def _distill(self, group) -> None:
            prompt = self.tokenizer.apply_chat_template(group["messages"][0], tokenize=False)
            got = await self.server.get_logprobs(input_ids=self.tokenizer(prompt)["input_ids"],
                                                 top_k=self.config.distill_topk, split="eval")
            group["distill_logprobs"] = got["prompt_topk_logprobs"]

        async def evaluate(self, *args, **kwargs) -> None:
            tools, valid_names = self._resolve_tools_for_group()
            samples = []
            for item in self._eval_items:
                task_id = str(uuid.uuid4())
                messages: List[Dict[str, Any]] = [{"role": "system", "content": self.config.system_prompt},
                                                  {"role": "user", "content": self.format_prompt(item)}]
                agent = HermesAgentLoop(server=self.server, tool_schemas=tools, valid_tool_names=valid_names,
                                        max_turns=self.config.max_agent_turns, task_id=task_id, temperature=0.0,
                                        max_tokens=self.config.max_token_length, extra_body=self.config.extra_body,
                                        budget_config=self.config.build_budget_config())
                result = await agent.run(messages)
                ctx = ToolContext(task_id)
                try:
                    reward = await self.compute_reward(item, result, ctx)
                finally:
                    ctx.cleanup()
                self._reward_buffer.pop()
                samples.append({"prompt": item["task"], "reward": reward, "turns": result.turns_used})
            mean = sum(s["reward"] for s in samples) / max(1, len(samples))
            await self.evaluate_log(metrics={"eval/mean_reward": mean}, samples=samples)

        async def wandb_log(self, wandb_metrics: Optional[Dict] = None) -> None:
            wandb_metrics = wandb_metrics or {}
            if self._reward_buffer:
                wandb_metrics["train/mean_reward"] = sum(self._reward_buffer) / len(self._reward_buffer)
                self._reward_buffer.clear()
            await super().wandb_log(wandb_metrics)
    '''
)

# --------------------------------------------------------------------------- Terminal-Bench 2
TERMINAL_BENCH = textwrap.dedent(
    '''
    """Eval-only: tasks from a dataset, each run with HermesAgentLoop, its tests uploaded after."""
    import asyncio
    import base64
    import io
    import shutil
    import tarfile
    import tempfile
    import uuid
    from pathlib import Path
    from typing import Any, Dict, List, Optional, Tuple

    from pydantic import Field

    from atroposlib.envs.base import EvalHandlingEnum
    from atroposlib.envs.server_handling.server_manager import APIServerConfig

    from environments.agent_loop import HermesAgentLoop
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
    from environments.tool_context import ToolContext
    from tools.terminal_tool import cleanup_vm, clear_task_env_overrides, register_task_env_overrides


    class TerminalTasksConfig(HermesAgentEnvConfig):
        dataset_name: str = Field(default="example-org/terminal-tasks", description="tasks")
        test_timeout: int = Field(default=60, description="test.sh deadline")
        task_filter: Optional[str] = Field(default=None, description="comma-separated task names")
        task_timeout: int = Field(default=600, description="per-task wall clock")


    def _untar(b64: str, where: Path) -> None:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(b64)), mode="r:gz") as tar:
            tar.extractall(path=str(where))


    class TerminalTasksEnv(HermesAgentBaseEnv):
        name = "terminal-tasks"
        env_config_cls = TerminalTasksConfig

        @classmethod
        def config_init(cls) -> Tuple[TerminalTasksConfig, List[APIServerConfig]]:
            config = TerminalTasksConfig(
                enabled_toolsets=["terminal", "file"], disabled_toolsets=None, distribution=None,
                max_agent_turns=6, max_token_length=16000, agent_temperature=0.6, system_prompt=None,
                terminal_backend="modal", terminal_timeout=300, tool_pool_size=128,
                eval_handling=EvalHandlingEnum.STOP_TRAIN, group_size=1, steps_per_eval=1, total_steps=1,
                use_wandb=True, wandb_name="terminal-tasks", ensure_scores_are_not_same=False,
            )
            servers = [APIServerConfig(base_url="https://openrouter.ai/api/v1", model_name="vendor/model",
                                       server_type="openai", api_key="", health_check=False)]
            return config, servers

        async def setup(self):
            from datasets import load_dataset

            tasks = list(load_dataset(self.config.dataset_name, split="train"))
            if self.config.task_filter:
                keep = {n.strip() for n in self.config.task_filter.split(",")}
                tasks = [t for t in tasks if t["task_name"] in keep]
            self.all_eval_items = tasks
            self.iter = 0
            self.eval_metrics: List[Tuple[str, float]] = []

        async def get_next_item(self):
            item = self.all_eval_items[self.iter % len(self.all_eval_items)]
            self.iter += 1
            return item

        def format_prompt(self, item: Dict[str, Any]) -> str:
            return item["instruction"]

        async def compute_reward(self, item, result, ctx) -> float:
            """Not used: the tests run in rollout_and_score_eval."""
            return 0.0

        async def collect_trajectories(self, item):
            return None, []

        async def score(self, rollout_group_data):
            return None

        async def rollout_and_score_eval(self, item: Dict[str, Any]) -> Dict:
            task_id = str(uuid.uuid4())
            try:
                register_task_env_overrides(task_id, {"modal_image": item.get("docker_image") or "python:3.11"})
                tools, valid_names = self._resolve_tools_for_group()
                messages: List[Dict[str, Any]] = [{"role": "user", "content": self.format_prompt(item)}]
                agent = HermesAgentLoop(server=self.server, tool_schemas=tools, valid_tool_names=valid_names,
                                        max_turns=self.config.max_agent_turns, task_id=task_id,
                                        temperature=self.config.agent_temperature,
                                        max_tokens=self.config.max_token_length, extra_body=self.config.extra_body)
                result = await agent.run(messages)
                if result.turns_used == 0:
                    reward = 0.0
                else:
                    ctx = ToolContext(task_id)
                    try:
                        loop = asyncio.get_event_loop()
                        reward = await loop.run_in_executor(None, self._run_tests, item, ctx)
                    finally:
                        ctx.cleanup()
                return {"task_name": item["task_name"], "category": item.get("category", "unknown"),
                        "passed": reward == 1.0, "reward": reward, "messages": result.messages}
            except Exception as e:
                return {"task_name": item["task_name"], "passed": False, "reward": 0.0, "error": str(e)}
            finally:
                clear_task_env_overrides(task_id)
                cleanup_vm(task_id)

        def _run_tests(self, item: Dict[str, Any], ctx: ToolContext) -> float:
            ctx.terminal("mkdir -p tests logs/verifier")
            local = Path(tempfile.mkdtemp(prefix="tests-"))
            try:
                _untar(item["tests_tar"], local)
                ctx.upload_dir(str(local), "tests")
            finally:
                shutil.rmtree(local, ignore_errors=True)
            ctx.write_file("tests/test.sh", item["test_sh"])
            ctx.terminal("chmod +x tests/test.sh")
            run = ctx.terminal("bash tests/test.sh", timeout=self.config.test_timeout)
            out = Path(tempfile.mkdtemp(prefix="verifier-"))
            try:
                ctx.download_dir("logs/verifier", str(out))
                reward_file = out / "reward.txt"
                if reward_file.exists():
                    return float(reward_file.read_text().strip() or 0)
                return 1.0 if run["exit_code"] == 0 else 0.0
            finally:
                shutil.rmtree(out, ignore_errors=True)

        async def _with_timeout(self, item):
            try:
                return await asyncio.wait_for(self.rollout_and_score_eval(item), timeout=self.config.task_timeout)
            except asyncio.TimeoutError:
                return {"task_name": item["task_name"], "passed": False, "reward": 0.0, "error": "timeout"}

        async def evaluate(self, *args, **kwargs) -> None:
            print(f"Evaluating {len(self.all_eval_items)} tasks")
            futures = [asyncio.ensure_future(self._with_timeout(item)) for item in self.all_eval_items]
            results = []
            for next_done in asyncio.as_completed(futures):
                results.append(await next_done)
            passed = sum(1 for r in results if r.get("passed"))
            metrics = {"eval/pass_rate": passed / max(1, len(results)), "eval/total_tasks": len(results)}
            self.eval_metrics = list(metrics.items())
            samples = [{"task_name": r.get("task_name"), "category": r.get("category"), "passed": r.get("passed"),
                        "reward": r.get("reward"), "error": r.get("error"), "messages": r.get("messages")}
                       for r in results]
            await self.evaluate_log(metrics=metrics, samples=samples,
                                    generation_parameters={"max_tokens": self.config.max_token_length})
            from tools.terminal_tool import cleanup_all_environments

            cleanup_all_environments()
            from environments.agent_loop import _tool_executor

            _tool_executor.shutdown(wait=False, cancel_futures=True)

        async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
            wandb_metrics = wandb_metrics or {}
            for key, value in self.eval_metrics:
                wandb_metrics[key] = value
            self.eval_metrics = []
            await super().wandb_log(wandb_metrics)
    '''
)

# --------------------------------------------------------------------------- TBLite
TBLITE = textwrap.dedent(
    '''
    """The lighter suite: the Terminal-Bench 2 env with another dataset and timeout."""
    from typing import List, Tuple

    from pydantic import Field

    from atroposlib.envs.server_handling.server_manager import APIServerConfig

    from environments.benchmarks.terminalbench_2.terminalbench2_env import TerminalTasksConfig, TerminalTasksEnv


    class LiteTasksConfig(TerminalTasksConfig):
        dataset_name: str = Field(default="example-org/lite-tasks", description="tasks")
        task_timeout: int = Field(default=300, description="per-task wall clock")


    class LiteTasksEnv(TerminalTasksEnv):
        name = "lite-tasks"
        env_config_cls = LiteTasksConfig

        @classmethod
        def config_init(cls) -> Tuple[LiteTasksConfig, List[APIServerConfig]]:
            config = LiteTasksConfig(
                enabled_toolsets=["terminal", "file"], max_agent_turns=6, max_token_length=16000,
                terminal_backend="modal", group_size=1, total_steps=1, use_wandb=False,
            )
            servers = [APIServerConfig(base_url="https://openrouter.ai/api/v1", model_name="vendor/model",
                                       server_type="openai", api_key="", health_check=False)]
            return config, servers
    '''
)

# --------------------------------------------------------------------------- YC-Bench
YC_BENCH = textwrap.dedent(
    '''
    """Eval-only, long-horizon: a simulation the agent drives through a CLI; its state is a host file."""
    import asyncio
    import json
    import os
    import subprocess
    import uuid
    from typing import Any, Dict, List, Optional, Tuple

    from pydantic import Field

    from atroposlib.envs.base import EvalHandlingEnum
    from atroposlib.envs.server_handling.server_manager import APIServerConfig

    from environments.agent_loop import HermesAgentLoop
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig

    SYSTEM_PROMPT = "You run a company through the `minisim` CLI: minisim status | work | end."


    class SimConfig(HermesAgentEnvConfig):
        presets: List[str] = Field(default=["easy"], description="presets")
        seeds: List[int] = Field(default=[1, 2], description="seeds")
        state_dir: str = Field(default="/tmp/minisim", description="per-run state files")
        run_timeout: int = Field(default=600, description="per-run wall clock")


    class SimEnv(HermesAgentBaseEnv):
        name = "minisim"
        env_config_cls = SimConfig

        @classmethod
        def config_init(cls) -> Tuple[SimConfig, List[APIServerConfig]]:
            config = SimConfig(
                enabled_toolsets=["terminal"], disabled_toolsets=None, distribution=None, max_agent_turns=8,
                max_token_length=32000, agent_temperature=0.0, system_prompt=SYSTEM_PROMPT,
                terminal_backend="local", terminal_timeout=60, eval_handling=EvalHandlingEnum.STOP_TRAIN,
                group_size=1, steps_per_eval=1, total_steps=1, use_wandb=True, wandb_name="minisim",
            )
            servers = [APIServerConfig(base_url="https://openrouter.ai/api/v1", model_name="vendor/model",
                                       server_type="openai", api_key=os.getenv("OPENROUTER_API_KEY", ""),
                                       health_check=False)]
            return config, servers

        async def setup(self):
            subprocess.run(["minisim", "--help"], capture_output=True, check=True, timeout=10)
            self.all_eval_items = [{"preset": p, "seed": s} for p in self.config.presets for s in self.config.seeds]
            os.makedirs(self.config.state_dir, exist_ok=True)
            self.eval_metrics: List[Tuple[str, float]] = []

        async def get_next_item(self):
            return self.all_eval_items[0]

        def format_prompt(self, item: Dict[str, Any]) -> str:
            return f"A new simulation ({item['preset']}, seed {item['seed']}) is ready. Survive to the end."

        async def compute_reward(self, item, result, ctx) -> float:
            return 0.0

        async def collect_trajectories(self, item):
            return None, []

        async def rollout_and_score_eval(self, item: Dict[str, Any]) -> Dict:
            run_id = str(uuid.uuid4())[:8]
            state = os.path.join(self.config.state_dir, f"sim_{run_id}.json")
            os.environ["MINISIM_STATE"] = state
            try:
                subprocess.run(["minisim", "init", str(item["seed"])], check=True, capture_output=True, timeout=30)
                tools, valid_names = self._resolve_tools_for_group()
                messages = [{"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": self.format_prompt(item)}]
                agent = HermesAgentLoop(server=self.server, tool_schemas=tools, valid_tool_names=valid_names,
                                        max_turns=self.config.max_agent_turns, task_id=run_id,
                                        temperature=self.config.agent_temperature,
                                        max_tokens=self.config.max_token_length, extra_body=self.config.extra_body,
                                        budget_config=self.config.build_budget_config())
                result = await agent.run(messages)
                with open(state) as f:
                    final = json.load(f)
                survived = final["ended"] and final["funds"] > 0
                return {"preset": item["preset"], "seed": item["seed"], "survived": survived,
                        "composite_score": 1.0 if survived else 0.0, "turns_used": result.turns_used}
            except Exception as e:
                return {"preset": item["preset"], "seed": item["seed"], "survived": False,
                        "composite_score": 0.0, "turns_used": 0, "error": str(e)}

        async def evaluate(self, *args, **kwargs) -> None:
            results = []
            for item in self.all_eval_items:
                results.append(await asyncio.wait_for(self.rollout_and_score_eval(item), self.config.run_timeout))
            avg = sum(r["composite_score"] for r in results) / max(1, len(results))
            metrics = {"eval/avg_composite_score": avg, "eval/total_runs": len(results)}
            self.eval_metrics = list(metrics.items())
            await self.evaluate_log(metrics=metrics, samples=[dict(r) for r in results])
            try:
                from tools.terminal_tool import cleanup_all_environments

                cleanup_all_environments()
            except Exception:
                pass

        async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
            wandb_metrics = wandb_metrics or {}
            for key, value in self.eval_metrics:
                wandb_metrics[key] = value
            self.eval_metrics = []
            await super().wandb_log(wandb_metrics)
    '''
)

# The simulation's CLI (stands in for yc-bench): state in $MINISIM_STATE, a JSON file.
MINISIM = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import json, os, sys

    path = os.environ.get("MINISIM_STATE", "")
    cmd = sys.argv[1] if len(sys.argv) > 1 else "--help"
    if cmd == "--help":
        print("minisim init SEED | status | work | end"); sys.exit(0)
    if cmd == "init":
        json.dump({"funds": 10, "ended": False}, open(path, "w")); print("ready"); sys.exit(0)
    if not path or not os.path.exists(path):
        print("no simulation: MINISIM_STATE is not set", file=sys.stderr); sys.exit(2)
    state = json.load(open(path))
    if cmd == "work":
        state["funds"] += 5
    elif cmd == "end":
        state["funds"] -= 8; state["ended"] = True
    json.dump(state, open(path, "w")); print(json.dumps(state))
    """
)

FILES = {
    "environments/terminal_test_env/terminal_test_env.py": TERMINAL_TEST,
    "environments/hermes_swe_env/hermes_swe_env.py": SWE,
    "environments/agentic_opd_env.py": OPD,
    "environments/benchmarks/terminalbench_2/terminalbench2_env.py": TERMINAL_BENCH,
    "environments/benchmarks/tblite/tblite_env.py": TBLITE,
    "environments/benchmarks/yc_bench/yc_bench_env.py": YC_BENCH,
}

# --------------------------------------------------------------------------- every ToolContext verb
# (tests/test_hermes_compat.py: the same rollout judged in a fresh reward shell and in the rollout's
# session must give the same answer to every verb)
VERBS = textwrap.dedent(
    '''
    """Calls every verb of the seed's ToolContext in compute_reward; keeps the answers."""
    from pathlib import Path
    from typing import List, Tuple

    from atroposlib.envs.server_handling.server_manager import APIServerConfig

    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
    from environments.tool_context import ToolContext


    class VerbsEnv(HermesAgentBaseEnv):
        name = "verbs"
        host_dir = "/nonexistent"

        @classmethod
        def config_init(cls) -> Tuple[HermesAgentEnvConfig, List[APIServerConfig]]:
            return HermesAgentEnvConfig(enabled_toolsets=["terminal", "file"], max_agent_turns=3,
                                        terminal_backend="modal", group_size=1), []

        async def setup(self):
            self.answers = {}

        async def get_next_item(self):
            return {"id": "verbs", "prompt": "Leave notes in ~/notes."}

        def format_prompt(self, item):
            return item["prompt"]

        async def compute_reward(self, item, result, ctx: ToolContext) -> float:
            host = Path(self.host_dir)
            (host / "tree" / "sub").mkdir(parents=True, exist_ok=True)
            (host / "u.txt").write_text("uploaded\\n")
            (host / "tree" / "sub" / "t.bin").write_bytes(bytes(range(256)))
            a = {}
            a["pwd"] = ctx.terminal("pwd")
            a["home"] = ctx.terminal("echo $HOME; cd ~ && pwd")
            a["tilde"] = ctx.terminal("cat ~/notes/a.txt")
            a["relative"] = ctx.terminal("cat notes/a.txt; ls -a notes")
            a["streams"] = ctx.terminal("echo out; echo err >&2; echo out2; exit 3")
            a["timeout"] = ctx.terminal("sleep 5", timeout=1)["exit_code"]  # (a session adds a restart note)
            a["read_tilde"] = ctx.read_file("~/notes/a.txt")
            a["read_relative"] = ctx.read_file("notes/a.txt")
            a["read_missing"] = ctx.read_file("notes/missing.txt")
            a["write"] = ctx.write_file("~/written.txt", "written")
            a["written"] = ctx.terminal("cat written.txt")
            a["upload_file"] = ctx.upload_file(str(host / "u.txt"), "up/u.txt")
            a["upload_missing"] = ctx.upload_file(str(host / "none.txt"), "up/none.txt")
            a["upload_dir"] = ctx.upload_dir(str(host / "tree"), "uptree")
            a["uploaded"] = ctx.terminal("cat up/u.txt; find uptree -type f | sort; md5sum uptree/sub/t.bin")
            a["download_file"] = ctx.download_file("~/notes/a.txt", str(host / "out" / "a.txt"))
            a["downloaded"] = (host / "out" / "a.txt").read_text()
            a["download_dir"] = ctx.download_dir("notes", str(host / "out" / "notes"))
            a["downloaded_dir"] = sorted(p.name for p in (host / "out" / "notes").iterdir())
            a["search"] = ctx.search("needle", "notes")
            a["web_search"] = ctx.web_search("anything")
            a["web_extract"] = ctx.web_extract(["http://127.0.0.1:9/"])
            a["browser_navigate"] = ctx.browser_navigate("http://127.0.0.1:9/")
            a["browser_snapshot"] = ctx.browser_snapshot()
            a["call_tool"] = ctx.call_tool("read_file", {"path": "notes/a.txt"})
            a["cleanup"] = ctx.cleanup()
            self.answers = a
            return 1.0

        async def evaluate(self, *args, **kwargs):
            pass
    '''
)
