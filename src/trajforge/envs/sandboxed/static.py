"""What an env file says about itself, read without running a line of it.

Listing env files the RL agent wrote must not import them (an import runs the file). The
:mod:`ast` module parses the source into a tree and nothing more; from the tree we take the
classes that look like envs, their ``name`` / ``description`` literals, docstrings and the
literal keyword arguments of a ``default_config`` that returns ``SomeConfig(field=literal, ...)``
(a class without a docstring shows the module's).
Anything that is not a literal is reported as not known, never evaluated.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

_DOC_CHARS = 500


@dataclass
class EnvSummary:
    """One class of an env file, as far as its source says without running."""

    class_name: str
    bases: list[str]
    name: str | None = None
    description: str | None = None
    doc: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"class": self.class_name, "bases": self.bases}
        for key in ("name", "description", "doc"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.config:
            out["config"] = self.config
        return out


class StaticReadError(ValueError):
    """The file is not Python this reader can parse (the message says where)."""


def read_env_classes(source: bytes | str, filename: str = "<env>") -> list[EnvSummary]:
    """The env-looking classes of ``source`` (top level; a base named ``*Env*`` or a
    ``compute_reward`` method), in file order. Raises :class:`StaticReadError` for a file that
    does not parse."""
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise StaticReadError(f"{filename} does not parse: {type(exc).__name__}: {exc}") from None
    module_doc = ast.get_docstring(tree)
    return [
        _summary(node, module_doc)
        for node in tree.body
        if isinstance(node, ast.ClassDef) and _looks_like_env(node)
    ]


def _looks_like_env(node: ast.ClassDef) -> bool:
    if any("Env" in _unparse(b) for b in node.bases):
        return True
    return any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "compute_reward"
        for n in node.body
    )


def _unparse(node: ast.AST) -> str:
    try:
        return ast.unparse(node)[:200]
    except (ValueError, RecursionError):
        return "?"


def _summary(node: ast.ClassDef, module_doc: str | None) -> EnvSummary:
    doc = ast.get_docstring(node) or module_doc
    out = EnvSummary(
        class_name=node.name,
        bases=[_unparse(b) for b in node.bases],
        doc=doc[:_DOC_CHARS] if doc else None,
    )
    for stmt in node.body:
        target, value = _assignment(stmt)
        if (
            target in ("name", "description")
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            setattr(out, target, value.value[:_DOC_CHARS])
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "default_config":
            out.config = _literal_config(stmt)
    return out


def _assignment(stmt: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id, stmt.value
    return None, None


def _literal_config(fn: ast.FunctionDef) -> dict[str, Any]:
    """``return Cfg(a=1, b=[...])`` -> ``{"a": 1, "b": [...]}`` (literal keywords only)."""
    for stmt in fn.body:
        if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Call):
            out: dict[str, Any] = {}
            for kw in stmt.value.keywords:
                if kw.arg is None:
                    continue
                try:
                    out[kw.arg] = ast.literal_eval(kw.value)
                except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                    out[kw.arg] = "(not a literal)"
            return out
    return {}
