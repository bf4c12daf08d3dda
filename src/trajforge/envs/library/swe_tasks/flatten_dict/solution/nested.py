from typing import Any


def get_path(d: dict[str, Any], path: str, sep: str = ".") -> Any:
    """The value at ``a.b.c``; KeyError when a part is missing."""
    node: Any = d
    for part in path.split(sep):
        node = node[part]
    return node


def flatten(d: dict[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{sep}{key}" if prefix else key
        if isinstance(value, dict) and value:
            out.update(flatten(value, sep, name))
        else:
            out[name] = value
    return out


def unflatten(d: dict[str, Any], sep: str = ".") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        *parents, last = key.split(sep)
        node = out
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"conflicting keys at {part!r}")
            node = child
        if last in node:
            raise ValueError(f"conflicting keys at {key!r}")
        node[last] = value
    return out
