"""``tblite``: the lighter Terminal-Bench task sets (TBLite and the like), bring your own directory.

Same Harbor layout, same reading, backends and verifier as :mod:`terminal_bench` (this is that env
under another name and default); what differs is where the tasks come from: the published sets
are downloaded with ``harbor`` (``harbor datasets download ...``) or a git checkout, which this
project cannot do for you offline, so ``tasks_dir`` (``--tasks DIR``) is required and there is no
shipped default. Records name the env ``tblite``, so scores on the light set are never mixed with
``terminal_bench`` ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from trajforge.envs.base import EnvDataError
from trajforge.envs.config import EnvConfig
from trajforge.envs.library.terminal_bench import TerminalBenchConfig, TerminalBenchEnv

HOW = (
    "tblite needs the task set on disk: download it with harbor on a machine with the internet "
    "(a directory of Harbor tasks: task.toml, instruction.md, environment/, tests/, solution/) and "
    "pass it: `trajforge env eval tblite --tasks DIR` (config: tasks_dir: DIR)"
)


class TbliteConfig(TerminalBenchConfig):
    tasks_dir: str | None = Field(None, description="directory of Harbor-layout tasks (required: none ship)")


class TbliteEnv(TerminalBenchEnv):
    name: ClassVar[str] = "tblite"
    description: ClassVar[str] = "TBLite (light Terminal-Bench) task directories, from --tasks DIR"
    config_class: ClassVar[type[EnvConfig]] = TbliteConfig

    @classmethod
    def default_config(cls) -> EnvConfig:
        return TbliteConfig(enabled_toolsets=["terminal", "file"], max_agent_turns=50)

    def tasks_root(self) -> Path:
        if not self.cfg.tasks_dir:
            raise EnvDataError(HOW)
        return Path(self.cfg.tasks_dir)
