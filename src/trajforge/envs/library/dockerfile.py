"""The Dockerfile subset that ``terminal_bench`` honours without Docker (under bwrap).

A parsed Dockerfile is a list of steps (WORKDIR, ENV, ARG, COPY/ADD of local files, RUN) plus the
notes on what was ignored (FROM: the sandbox's base is the host's read-only /usr; USER, CMD,
ENTRYPOINT, EXPOSE, LABEL, ...) and the problems that make a task unrunnable there (a RUN step
that needs a package manager or the network, multi-stage builds, ``COPY --from``, remote or
archive ``ADD``, heredocs, a COPY or WORKDIR outside the first WORKDIR, no WORKDIR at all).

The first WORKDIR is the task's root (``/app`` in Terminal-Bench): under bwrap it *is* the
sandbox workdir (``/workspace``), and :func:`rewrite_paths` maps that root and the harness paths
(``/tests``, ``/logs``, ``/solution``) in every text the task ships (instruction, RUN steps, ENV
values, solve.sh, tests).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from posixpath import join, normpath
from typing import Literal

# A RUN step (or test.sh / solve.sh) that installs or downloads: it cannot run in the sandbox.
NEEDS_MORE = re.compile(
    r"(?<![\w./-])(apt-get|apt|aptitude|apk|yum|dnf|microdnf|zypper|pacman|dpkg|rpm|pip|pip3|pipx|uv|uvx"
    r"|conda|mamba|micromamba|npm|npx|yarn|pnpm|gem|cargo|rustup|curl|wget|brew|add-apt-repository"
    r"|git\s+clone|go\s+(?:install|get))(?![\w-])"
)
_IGNORED = {
    "USER", "CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL",
    "VOLUME", "SHELL", "ONBUILD",
}  # fmt: skip
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass
class Step:
    kind: Literal["workdir", "env", "arg", "copy", "run"]
    text: str = ""  # RUN: the shell command; WORKDIR: the path
    env: dict[str, str] = field(default_factory=dict)  # ENV/ARG assignments
    sources: list[str] = field(default_factory=list)  # COPY: context-relative sources
    dest: str = ""  # COPY: absolute destination (relative ones resolved against WORKDIR)


@dataclass
class DockerPlan:
    steps: list[Step] = field(default_factory=list)
    root: str | None = None  # the first WORKDIR
    workdir: str = "/"  # the last WORKDIR: where the agent starts
    env: dict[str, str] = field(default_factory=dict)  # ENV at the end (the agent's environment)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    buf = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and buf):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        buf += stripped
        if buf.strip():
            lines.append(buf.strip())
        buf = ""
    if buf.strip():
        lines.append(buf.strip())
    return lines


def _expand(value: str, env: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def _assignments(rest: str, env: Mapping[str, str]) -> dict[str, str]:
    parts = shlex.split(rest)
    if parts and "=" not in parts[0]:  # legacy ``ENV KEY value with spaces``
        return {parts[0]: _expand(rest.split(None, 1)[1] if len(parts) > 1 else "", env)}
    out: dict[str, str] = {}
    for part in parts:
        key, _, value = part.partition("=")
        out[key] = _expand(value, {**env, **out})
    return out


def _json_or_words(rest: str) -> list[str]:
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return shlex.split(rest)


def parse_dockerfile(text: str) -> DockerPlan:
    plan = DockerPlan()
    env: dict[str, str] = {}  # ENV and ARG values, for expansion in later steps
    froms = 0
    for line in _logical_lines(text):
        word, _, rest = line.partition(" ")
        op, rest = word.upper(), rest.strip()
        if "<<" in rest and op in {"RUN", "COPY", "ADD"}:
            plan.problems.append(f"{op} with a heredoc is not supported under bwrap")
        elif op == "FROM":
            froms += 1
            if froms > 1:
                plan.problems.append("multi-stage builds (several FROM) are not supported under bwrap")
            else:
                plan.notes.append(f"FROM {rest} ignored under bwrap: the base is the host's read-only /usr")
        elif op == "WORKDIR":
            path = normpath(join(plan.workdir, _expand(rest, env)))
            plan.steps.append(Step("workdir", text=path))
            if plan.root is None:
                if path == "/":
                    plan.problems.append("WORKDIR / cannot be the sandbox workdir")
                plan.root = path
            elif not _under(path, plan.root):
                plan.problems.append(f"WORKDIR {path} is outside the first WORKDIR {plan.root}")
            plan.workdir = path
        elif op in {"ENV", "ARG"}:
            values = _assignments(rest, env)
            if op == "ARG":
                values = {k: env.get(k, v) for k, v in values.items()}
            env.update(values)
            if op == "ENV":
                plan.env.update(values)
            plan.steps.append(Step("env" if op == "ENV" else "arg", env=values))
        elif op in {"COPY", "ADD"}:
            _copy(plan, op, rest, env)
        elif op == "RUN":
            argv = _json_or_words(rest) if rest.startswith("[") else None
            command = shlex.join(argv) if argv is not None else rest
            found = NEEDS_MORE.search(command)
            if found:
                plan.problems.append(
                    f"RUN needs a package manager or the network ({found.group(1)}): {command[:120]}"
                )
            plan.steps.append(Step("run", text=command))
        elif op in _IGNORED:
            plan.notes.append(f"{op} ignored under bwrap")
        else:
            plan.problems.append(f"unsupported Dockerfile instruction {op}")
    if plan.root is None:
        plan.problems.append("no WORKDIR: the bwrap backend maps the first WORKDIR to the sandbox workdir")
    return plan


def _copy(plan: DockerPlan, op: str, rest: str, env: Mapping[str, str]) -> None:
    words = _json_or_words(rest)
    flags = [w for w in words if w.startswith("--")]
    args = [_expand(w, env) for w in words if not w.startswith("--")]
    for flag in flags:
        if flag.startswith("--from"):
            plan.problems.append(f"{op} {flag} (from another stage or image) is not supported under bwrap")
        else:
            plan.notes.append(f"{op} {flag.split('=')[0]} ignored under bwrap")
    if len(args) < 2:
        plan.problems.append(f"{op} needs a source and a destination: {rest}")
        return
    *sources, dest = args
    for src in sources:
        if op == "ADD" and (re.match(r"^[a-z]+://", src) or re.search(r"\.(tar|tgz|tar\.\w+)$", src)):
            plan.problems.append(f"ADD {src}: remote or archive sources are not supported under bwrap")
        if ".." in src.split("/"):
            plan.problems.append(f"{op} {src}: a source outside the build context")
    path = normpath(join(plan.workdir, dest))
    if dest.endswith("/") or dest in (".", "..") or len(sources) > 1 or path == plan.workdir:
        path += "/"  # into a directory (Docker's rule for these forms)
    if plan.root is None or not _under(path.rstrip("/") or "/", plan.root):
        plan.problems.append(f"{op} into {dest}: outside the first WORKDIR (under bwrap only it is writable)")
    plan.steps.append(Step("copy", sources=sources, dest=path))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def rewrite_paths(text: str, mapping: Mapping[str, str]) -> str:
    """Replace each absolute path prefix of ``mapping`` where it stands as a path (``/app`` and
    ``/app/x``, and ``/app`` ending a sentence, not ``/apple``, ``/app.py`` or ``/x/app``)."""
    live = {k: v for k, v in mapping.items() if k != v}
    if not live:
        return text
    keys = sorted(live, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(k) for k in keys) + r")(?![\w-]|\.\w)")
    return pattern.sub(lambda m: live[m.group(1)], text)
