"""The ``docker`` backend: one container per sandbox, driven through the ``docker`` CLI.

Kept small on purpose: ``docker run -d`` a container that sleeps, with the sandbox's host
directories bind-mounted at ``/workspace`` and ``/tmp`` (so file access stays host-side, binary-safe
and confined exactly as in the other backends), no network unless ``config.network``, and
``--pids-limit``/``--memory`` from the limits; the exec agent runs via ``docker exec -i``. This
needs a *local* engine (bind mounts) and an image with ``python3`` (the default
``python:3.11-slim`` has it). ``close`` removes the container, which kills everything in it.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid

from trajforge.sandbox.cgroup import SandboxCgroup
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.sandbox.factory import ProcessSandboxFactory
from trajforge.sandbox.launch import Launch, command_env, limit_env
from trajforge.sandbox.layout import Layout

INSIDE_WORKDIR = "/workspace"
INSIDE_SCRATCH = "/tmp"
INSIDE_AGENT = "/run/trajforge/agent.py"


async def _docker(*args: str, limit_s: float = 120) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"docker {args[0]} timed out after {limit_s}s"
    return proc.returncode or 0, out.decode(errors="replace")


class DockerSandboxFactory(ProcessSandboxFactory):
    """Sandboxes in Docker containers; ``image`` per create overrides ``config.docker_image``."""

    kind = "docker"

    async def _probe(self) -> str:
        if shutil.which("docker") is None:
            return "the docker CLI is not installed; install Docker or choose `--sandbox bwrap`"
        code, out = await _docker("info", "--format", "{{.ServerVersion}}", limit_s=30)
        if code != 0:
            return (
                f"no Docker engine is reachable (`docker info` failed: {out.strip()[-300:]}); "
                "start the engine or choose `--sandbox bwrap`"
            )
        return ""

    async def _launch(self, task_id: str, layout: Layout, cgroup: SandboxCgroup, image: str | None) -> Launch:
        name = f"trajforge-{uuid.uuid4().hex[:16]}"
        limits = self.config.limits
        env = command_env(self.config, INSIDE_WORKDIR, INSIDE_SCRATCH)
        env |= limit_env(self.config, SandboxCgroup(), nproc_effective=False)
        env.pop("TF_LIMIT_AS_KB", None)  # --memory caps the container as a whole
        code, out = await _docker(
            "run", "-d", "--rm", "--name", name,
            *([] if self.config.network else ["--network", "none"]),
            "--pids-limit", str(limits.max_processes),
            "--memory", f"{limits.memory_mb}m",
            "-v", f"{layout.work}:{INSIDE_WORKDIR}",
            "-v", f"{layout.tmp}:{INSIDE_SCRATCH}",
            "-v", f"{layout.agent}:{INSIDE_AGENT}:ro",
            "-w", INSIDE_WORKDIR,
            "--entrypoint", "sleep",
            image or self.config.docker_image,
            "infinity",
        )  # fmt: skip
        if code != 0:
            raise SandboxUnavailableError(f"docker run failed: {out.strip()[-500:]}")

        async def teardown() -> None:
            await _docker("rm", "-f", name, limit_s=60)

        env_args = [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]
        argv = [
            "docker", "exec", "-i", "-w", INSIDE_WORKDIR, *env_args, name,
            "python3", "-I", "-S", INSIDE_AGENT, INSIDE_WORKDIR, INSIDE_SCRATCH,
        ]  # fmt: skip
        return Launch(argv=argv, workdir=INSIDE_WORKDIR, scratch_dir=INSIDE_SCRATCH, teardown=teardown)
