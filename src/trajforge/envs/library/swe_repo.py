"""The repository side of the ``swe`` runner: the interpreter that runs the code under test.

Started by :mod:`swe_runner` (``python3 -I swe_repo.py ROOT IN_FD OUT_FD``) once per hidden test,
with the repository first on ``sys.path`` and nothing but two pipes to the runner. It answers
requests (import a module, get or set an attribute, call, index, iterate, ...) with values: plain
data (``None``, bool, int, float, str, bytes, list, tuple, dict, set) by value, any other object
as a handle (``{"$": "ref"}``) the runner can make further requests on, exceptions by their class.

Nothing here is trusted: this process runs the model's code, which can rewrite every function in
it. That is the point of the split -- whatever the model's code does in here, the runner only
ever sees the values it sends back, and judges them itself (see :mod:`swe_runner`).
"""

from __future__ import annotations

import base64
import builtins
import importlib
import json
import os
import sys
import traceback
from typing import Any

PLAIN_SCALARS = (type(None), bool, int, float, str)
MAX_DEPTH = 64


class Objects:
    def __init__(self) -> None:
        self.table: dict[int, Any] = {}

    def ref(self, obj: Any) -> int:
        self.table[id(obj)] = obj
        return id(obj)

    def encode(self, obj: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError("value nested too deep to send")
        t = type(obj)
        if t in PLAIN_SCALARS:
            if t is int and abs(obj).bit_length() > 4000:
                return {"$": "bigint", "v": hex(obj)}
            return obj
        if t is list:
            return [self.encode(x, depth + 1) for x in obj]
        if t is tuple:
            return {"$": "tuple", "v": [self.encode(x, depth + 1) for x in obj]}
        if t in (set, frozenset):
            return {"$": t.__name__, "v": [self.encode(x, depth + 1) for x in obj]}
        if t is dict:
            return {
                "$": "dict",
                "v": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in obj.items()],
            }
        if t is bytes:
            return {"$": "bytes", "v": base64.b64encode(obj).decode()}
        if isinstance(obj, type) and issubclass(obj, BaseException):
            name = str(getattr(obj, "__name__", ""))
            if getattr(builtins, name, None) is obj:
                return {"$": "builtin_exc", "name": name}
            bases = [self.encode(b, depth + 1) for b in obj.__bases__ if issubclass(b, BaseException)]
            return {"$": "exc_class", "id": self.ref(obj), "name": obj.__name__, "bases": bases}
        return {"$": "ref", "id": self.ref(obj), "type": t.__name__}

    def decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.decode(x) for x in value]
        if not isinstance(value, dict):
            return value
        tag = value.get("$")
        if tag == "tuple":
            return tuple(self.decode(x) for x in value["v"])
        if tag in ("set", "frozenset"):
            return (set if tag == "set" else frozenset)(self.decode(x) for x in value["v"])
        if tag == "dict":
            return {self.decode(k): self.decode(v) for k, v in value["v"]}
        if tag == "bytes":
            return base64.b64decode(value["v"])
        if tag == "bigint":
            return int(value["v"], 16)
        if tag == "builtin_exc":
            return getattr(builtins, value["name"])
        if tag in ("ref", "exc_class"):
            return self.table[value["id"]]
        raise ValueError(f"unknown value tag {tag!r}")


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        mod = getattr(obj, "__name__", None)
        if isinstance(obj, type(sys)) and isinstance(mod, str):  # a submodule not imported yet
            return importlib.import_module(f"{mod}.{name}")
        raise


def handle(objs: Objects, req: dict[str, Any]) -> Any:
    op = req["op"]
    if op == "import":
        return importlib.import_module(req["name"])
    obj = objs.table[req["ref"]]
    if op == "getattr":
        return _attr(obj, req["name"])
    if op == "setattr":
        setattr(obj, req["name"], objs.decode(req["value"]))
        return None
    if op == "call":
        args = objs.decode(req["args"])
        kwargs = {k: objs.decode(v) for k, v in req["kwargs"].items()}
        return obj(*args, **kwargs)
    if op == "getitem":
        return obj[objs.decode(req["key"])]
    if op == "setitem":
        obj[objs.decode(req["key"])] = objs.decode(req["value"])
        return None
    if op == "delitem":
        del obj[objs.decode(req["key"])]
        return None
    if op == "contains":
        return objs.decode(req["value"]) in obj
    if op == "len":
        return len(obj)
    if op == "iter":
        return iter(obj)
    if op == "next":
        return next(obj)
    if op == "bool":
        return bool(obj)
    if op == "repr":
        return repr(obj)
    if op == "str":
        return str(obj)
    raise ValueError(f"unknown request {op!r}")


def _read(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def _write(fd: int, data: bytes) -> None:
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def serve(root: str, in_fd: int, out_fd: int) -> None:
    sys.path.insert(0, root)
    os.chdir(root)
    objs = Objects()
    while True:
        try:
            req = json.loads(_read(in_fd, int.from_bytes(_read(in_fd, 4), "big")))
        except EOFError:
            return
        try:
            reply = {"ok": objs.encode(handle(objs, req))}
        except BaseException as exc:  # the code under test raised: its class and message go back
            try:
                args = [objs.encode(a) for a in exc.args]
            except Exception:
                args = [str(exc)]
            reply = {
                "exc": {
                    "class": objs.encode(type(exc)),
                    "args": args,
                    "text": traceback.format_exc()[-2000:],
                }
            }
        _write(out_fd, json.dumps(reply).encode())


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
