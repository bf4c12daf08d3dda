"""The ``local`` backend: commands run directly on the host, in a fresh directory. No isolation.

An explicit opt-in (``--sandbox local``) for machines without bubblewrap or for trusted tasks. It
keeps everything else of a sandbox: a persistent shell session, per-command timeouts that kill the
process group, output caps, rlimits, a per-sandbox cgroup where the host allows one (which also
catches processes that left their process group at close), and a minimal environment without the
host's variables, so API keys never reach the commands.
"""

from __future__ import annotations

import os

from trajforge.sandbox.cgroup import SandboxCgroup
from trajforge.sandbox.factory import ProcessSandboxFactory
from trajforge.sandbox.launch import Launch, command_env, limit_env
from trajforge.sandbox.layout import Layout


class LocalSandboxFactory(ProcessSandboxFactory):
    """Sandboxes that are just directories on the host (``workdir`` is a host path)."""

    kind = "local"
    forks = True  # an overlay on the host as root, a copy otherwise (sandbox.templates)

    async def _launch(self, task_id: str, layout: Layout, cgroup: SandboxCgroup, image: str | None) -> Launch:
        workdir, scratch = str(layout.work), str(layout.tmp)
        env = command_env(self.config, workdir, scratch)
        env |= limit_env(self.config, cgroup, nproc_effective=os.geteuid() != 0)
        argv = [*cgroup.join_command(), str(layout.agent), workdir, scratch]
        return Launch(argv=argv, workdir=workdir, scratch_dir=scratch, env=env)
