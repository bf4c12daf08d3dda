from typing import Any


def get_path(d: dict[str, Any], path: str, sep: str = ".") -> Any:
    """The value at ``a.b.c``; KeyError when a part is missing."""
    node: Any = d
    for part in path.split(sep):
        node = node[part]
    return node
