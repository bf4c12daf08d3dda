"""The ``swe`` env's test runner: copied into the finished rollout's sandbox and run there.

**The rule it keeps**: the hidden tests, and the code that records their results, never share an
interpreter or a writable location with the model's code. Anything in the same interpreter as
the code under test can be forged by it (it can walk the frames to the runner's locals, replace
the function that records a result, even ``sys.settrace`` its way past an ``assert``), so the
repository's code runs in a *separate* interpreter (:mod:`swe_repo`, one per test) and this
process only talks to it over a pipe:

- The hidden test file runs *here*. Its ``import`` of a repository module (a top-level name
  found in the repository, never one of the standard library) gives a proxy: attribute access,
  calls, indexing, ``in``, ``len``, iteration, ``bool``, ``repr``/``str`` and attribute
  assignment are requests to the repository's interpreter.
- Values come back as data: ``None``, bool, int, float, str, bytes, list, tuple, dict, set,
  frozenset are rebuilt here from JSON; any other object (an instance of a repository class, a
  function, a generator) stays over there as a handle. Handles compare equal only to themselves:
  an object whose ``__eq__`` always says True cannot pass ``assert result == [...]``, because
  the comparison is made here, between values. Exceptions come back by class: builtin ones as
  themselves, the repository's own as local classes of the same name and bases, so ``except
  ledger.InsufficientFunds`` and ``except ValueError`` work as in pytest.
- So the code under test can influence the run only through the values it returns -- which is
  solving the task. It cannot read this process (non-dumpable, see :mod:`trusted_proc`), leave a
  process behind (each test's interpreter and all its descendants are killed), or forge the
  result line (it carries an HMAC keyed by a nonce that only this process ever held).

Limits, by design: a test that compares two repository objects with ``==`` compares handles;
``isinstance(x, RepoClass)`` and arithmetic on repository objects are not forwarded; values are
copies (mutating a returned list does not mutate the repository's). Test files must be
pytest-style (module-level ``test_*`` functions with plain ``assert``, or
``unittest.TestCase`` classes) and must not import pytest; the shipped ones also pass under real
pytest (tested). Each test gets a fresh repository interpreter and re-executes its test module.

Why not pytest in any case: the sandbox runs the system ``python3`` (bwrap shows the host's
/usr, not our virtualenv), which need not have pytest; and pytest runs the code under test in its
own interpreter, which is exactly what the rule forbids.

Usage: ``python3 -I -S swe_runner.py NONCE_FILE ROOT TEST_FILE...`` (with ``trusted_proc.py`` and
``swe_repo.py`` beside it); prints one line ``TRAJFORGE-SWE-RESULT <hmac> <json>`` with ``{"results": {id: outcome}, "errors": {id: text}}``.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import inspect
import json
import linecache
import os
import signal
import subprocess
import sys
import traceback
import unittest
from types import FrameType, ModuleType
from typing import Any, TypeVar

if __package__:  # imported as part of trajforge (its tests, the type checker)
    from trajforge.envs.library import trusted_proc
else:  # the copy in the sandbox: the verifier puts trusted_proc.py beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import trusted_proc  # type: ignore[no-redef]

MARKER = "TRAJFORGE-SWE-RESULT"
PER_TEST_TIMEOUT_S = 20
MAX_MESSAGE = 16 * 1024 * 1024
REPO_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "swe_repo.py")


_T = TypeVar("_T")


class _Timeout(Exception):
    pass


class RepoError(Exception):
    """The repository's interpreter broke the protocol or died."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Timeout(f"test ran longer than {PER_TEST_TIMEOUT_S}s")


# --------------------------------------------------------------------------- the repository side


class Session:
    """One repository interpreter (one test): a child process and the proxies onto it."""

    def __init__(self, root: str) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", REPO_SERVER, root, str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=root,
            env={k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ},
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.exc_classes: dict[int, type[BaseException]] = {}
        self.modules: dict[str, Any] = {}

    def close(self) -> None:
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            self.proc.kill()
        trusted_proc.kill_descendants()

    # -- the wire

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = os.read(self._from_child, n - len(out))
            if not chunk:
                raise RepoError("the repository's interpreter exited")
            out += chunk
        return out

    def request(self, op: str, **fields: Any) -> Any:
        data = json.dumps({"op": op, **fields}).encode()
        view = memoryview(len(data).to_bytes(4, "big") + data)
        try:
            while view:
                view = view[os.write(self._to_child, view) :]
        except OSError as exc:
            raise RepoError(f"the repository's interpreter is gone ({exc})") from None
        size = int.from_bytes(self._read(4), "big")
        if size > MAX_MESSAGE:
            raise RepoError(f"a reply of {size} bytes (more than {MAX_MESSAGE})")
        try:
            reply = json.loads(self._read(size))
        except (ValueError, RecursionError) as exc:
            raise RepoError(f"an unreadable reply ({type(exc).__name__})") from None
        if not isinstance(reply, dict):
            raise RepoError("a reply that is not an object")
        if "ok" in reply:
            return self.decode(reply["ok"])
        exc_info = reply.get("exc")
        if not isinstance(exc_info, dict):
            raise RepoError("a reply with neither a value nor an exception")
        cls = self.decode(exc_info.get("class"))
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise RepoError("an exception reply without an exception class")
        raw_args = exc_info.get("args")
        args = self.decode(raw_args) if isinstance(raw_args, list) else []
        try:
            err = cls(*args)
        except Exception:
            err = cls()
        text = exc_info.get("text")
        err.__notes__ = [f"raised in the repository:\n{text if isinstance(text, str) else ''}"]
        raise err

    # -- values

    def decode(self, value: Any, depth: int = 0) -> Any:
        if depth > 200:
            raise RepoError("a value nested too deep")
        if value is None or type(value) in (bool, int, float, str):
            return value
        if type(value) is list:
            return [self.decode(x, depth + 1) for x in value]
        if type(value) is not dict:
            raise RepoError(f"a value of JSON type {type(value).__name__}")
        tag = value.get("$")
        items: Any = value.get("v")
        try:
            if tag == "tuple":
                return tuple(self.decode(x, depth + 1) for x in items)
            if tag == "set":
                return {self.decode(x, depth + 1) for x in items}
            if tag == "frozenset":
                return frozenset(self.decode(x, depth + 1) for x in items)
            if tag == "dict":
                return {self.decode(k, depth + 1): self.decode(v, depth + 1) for k, v in items}
            if tag == "bytes":
                return base64.b64decode(items, validate=True)
            if tag == "bigint":
                return int(items, 16)
            if tag == "ref":
                return Remote(self, int(value["id"]), str(value.get("type", "object")))
            if tag == "builtin_exc":
                cls = getattr(builtins, str(value.get("name")), None)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    return cls
                raise RepoError(f"no builtin exception {value.get('name')!r}")
            if tag == "exc_class":
                return self._exc_class(value, depth)
        except RepoError:
            raise
        except Exception as exc:  # TypeError (unhashable key), ValueError, KeyError...: bad data
            raise RepoError(f"a malformed {tag!r} value ({type(exc).__name__}: {exc})") from None
        raise RepoError(f"an unknown value tag {tag!r}")

    def _exc_class(self, value: dict[str, Any], depth: int) -> type[BaseException]:
        ref = int(value["id"])
        if ref in self.exc_classes:
            return self.exc_classes[ref]
        bases = tuple(self.decode(b, depth + 1) for b in value.get("bases") or [])
        if not bases or not all(isinstance(b, type) and issubclass(b, BaseException) for b in bases):
            bases = (Exception,)
        name = str(value.get("name") or "RepositoryError")
        if not name.isidentifier():
            name = "RepositoryError"
        try:
            cls = type(name, bases, {"_tf_ref": ref, "_tf_session": self})
        except TypeError:  # bases whose layouts conflict
            cls = type(name, (Exception,), {"_tf_ref": ref, "_tf_session": self})
        self.exc_classes[ref] = cls
        return cls

    def encode(self, value: Any, depth: int = 0) -> Any:
        """A value the test passes to the repository: data, or a handle the repository gave us."""
        if depth > 200:
            raise TypeError("a value nested too deep to pass to the repository")
        t = type(value)
        if value is None or t in (bool, int, float, str):
            if t is int and abs(value).bit_length() > 4000:
                return {"$": "bigint", "v": hex(value)}
            return value
        if t is list:
            return [self.encode(x, depth + 1) for x in value]
        if t is tuple:
            return {"$": "tuple", "v": [self.encode(x, depth + 1) for x in value]}
        if t in (set, frozenset):
            return {"$": t.__name__, "v": [self.encode(x, depth + 1) for x in value]}
        if t is dict:
            return {
                "$": "dict",
                "v": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in value.items()],
            }
        if t is bytes:
            return {"$": "bytes", "v": base64.b64encode(value).decode()}
        if t is Remote and object.__getattribute__(value, "_s") is self:
            return {"$": "ref", "id": object.__getattribute__(value, "_id")}
        if isinstance(value, type) and issubclass(value, BaseException):
            if getattr(value, "_tf_session", None) is self:
                return {"$": "exc_class", "id": value.__dict__["_tf_ref"]}
            name = str(getattr(value, "__name__", ""))
            if getattr(builtins, name, None) is value:
                return {"$": "builtin_exc", "name": name}
        raise TypeError(
            f"cannot pass a {t.__name__} to the repository's code (only data and its own objects)"
        )

    def import_module(self, name: str) -> Any:
        if name not in self.modules:
            self.modules[name] = self.request("import", name=name)
        return self.modules[name]


class Remote:
    """A handle on an object in the repository's interpreter."""

    __slots__ = ("_s", "_id", "_type")

    def __init__(self, session: Session, ref: int, type_name: str) -> None:
        object.__setattr__(self, "_s", session)
        object.__setattr__(self, "_id", ref)
        object.__setattr__(self, "_type", type_name)

    def _req(self, op: str, **fields: Any) -> Any:
        return object.__getattribute__(self, "_s").request(
            op, ref=object.__getattribute__(self, "_id"), **fields
        )

    def _enc(self, value: Any) -> Any:
        return object.__getattribute__(self, "_s").encode(value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # copy/pickle/inspect probes stay here
        return self._req("getattr", name=name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._req("setattr", name=name, value=self._enc(value))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._req(
            "call", args=[self._enc(a) for a in args], kwargs={k: self._enc(v) for k, v in kwargs.items()}
        )

    def __getitem__(self, key: Any) -> Any:
        return self._req("getitem", key=self._enc(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._req("setitem", key=self._enc(key), value=self._enc(value))

    def __delitem__(self, key: Any) -> None:
        self._req("delitem", key=self._enc(key))

    def __contains__(self, value: Any) -> bool:
        return _typed(self._req("contains", value=self._enc(value)), bool, "in")

    def __len__(self) -> int:
        n = _typed(self._req("len"), int, "len()")
        if n < 0:
            raise ValueError("len() of a repository object is negative")
        return n

    def __iter__(self) -> Any:
        return _RemoteIter(self._req("iter"))

    def __bool__(self) -> bool:
        return _typed(self._req("bool"), bool, "bool()")

    def __repr__(self) -> str:
        try:
            return _typed(self._req("repr"), str, "repr()")
        except Exception:
            return f"<repository {object.__getattribute__(self, '_type')}>"

    def __str__(self) -> str:
        return _typed(self._req("str"), str, "str()")

    def __eq__(self, other: object) -> bool:
        if type(other) is Remote:
            return bool(
                object.__getattribute__(self, "_s") is object.__getattribute__(other, "_s")
                and object.__getattribute__(self, "_id") == object.__getattribute__(other, "_id")
            )
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return NotImplemented if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((id(object.__getattribute__(self, "_s")), object.__getattribute__(self, "_id")))


class _RemoteIter:
    def __init__(self, it: Any) -> None:
        self.it = it

    def __iter__(self) -> _RemoteIter:
        return self

    def __next__(self) -> Any:
        if type(self.it) is not Remote:
            raise TypeError("iter() of a repository object gave no iterator")
        return self.it._req("next")


def _typed(value: Any, kind: type[_T], what: str) -> _T:
    if type(value) is not kind:
        raise TypeError(f"{what} of a repository object returned {type(value).__name__}, not {kind.__name__}")
    return value


# ------------------------------------------------------------------------------ the tests' side


def repo_names(root: str) -> set[str]:
    """Top-level names the repository provides (``x.py``, or a directory ``x/`` with Python
    files); the standard library's names stay the standard library's."""
    names = set()
    for entry in os.listdir(root):
        path = os.path.join(root, entry)
        if entry.endswith(".py") and os.path.isfile(path):
            name = entry[:-3]
        elif os.path.isdir(path) and not os.path.islink(path):
            name = entry
        else:
            continue
        if (
            name.isidentifier()
            and name not in getattr(sys, "stdlib_module_names", ())
            and name not in sys.builtin_module_names
        ):
            names.add(name)
    return names


def load_tests(path: str, source: str, index: int, session: Session, names: set[str]) -> ModuleType:
    """Run a hidden test file here, its repository imports answered by ``session``."""
    real_import = builtins.__import__

    def imp(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name.partition(".")[0] in names:
            leaf = session.import_module(name)
            return leaf if fromlist else session.import_module(name.partition(".")[0])
        return real_import(name, globals, locals, fromlist, level)

    module = ModuleType(f"_trajforge_hidden_{index}")
    module.__file__ = path
    module.__dict__["__builtins__"] = {**vars(builtins), "__import__": imp}
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    sys.modules[module.__name__] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def cases(module: ModuleType) -> list[tuple[str, Any]]:
    """(name, callable) of the module's tests, in source order."""
    out: list[tuple[str, Any]] = []
    for name, obj in vars(module).items():
        if name.startswith("test") and inspect.isfunction(obj) and obj.__module__ == module.__name__:
            out.append((name, obj))
        elif (
            inspect.isclass(obj) and issubclass(obj, unittest.TestCase) and obj.__module__ == module.__name__
        ):
            for method in unittest.defaultTestLoader.getTestCaseNames(obj):
                out.append((f"{name}::{method}", obj(method)))
    return out


def run_one(case: Any) -> str | None:
    """None when the test passed, else the failure text."""
    signal.alarm(PER_TEST_TIMEOUT_S)
    try:
        if isinstance(case, unittest.TestCase):
            result = unittest.TestResult()
            case.run(result)
            problems = result.errors + result.failures
            if problems:
                return problems[0][1][-2000:]
            if result.skipped or result.unexpectedSuccesses:
                return "skipped"
            return None
        case()
        return None
    except BaseException:  # a test that raises SystemExit or KeyboardInterrupt failed, too
        return traceback.format_exc()[-2000:]
    finally:
        signal.alarm(0)


def run_file(
    root: str, path: str, source: str, index: int, names: set[str]
) -> tuple[dict[str, str], dict[str, str]]:
    rel = os.path.relpath(path, root)
    results: dict[str, str] = {}
    errors: dict[str, str] = {}
    todo: list[str] | None = None  # test names, known after the first load
    done = 0
    while todo is None or done < len(todo):
        session = Session(root)
        try:
            signal.alarm(PER_TEST_TIMEOUT_S)
            try:
                found = dict(cases(load_tests(path, source, index, session, names)))
            finally:
                signal.alarm(0)
        except BaseException:
            session.close()
            text = traceback.format_exc()[-2000:]
            if todo is None:
                return {rel: "error"}, {rel: text}
            for name in todo[done:]:
                results[f"{rel}::{name}"], errors[f"{rel}::{name}"] = "failed", text
            break
        if todo is None:
            todo = list(found)
            if not todo:
                session.close()
                break
        name = todo[done]
        test_id = f"{rel}::{name}"
        try:
            failure = run_one(found[name]) if name in found else "the test disappeared on reload"
        finally:
            session.close()
        results[test_id] = "passed" if failure is None else "failed"
        if failure is not None:
            errors[test_id] = failure
        done += 1
    return results, errors


def _print_result(line: str) -> None:
    """Straight to fd 1 (the hidden tests ran here and may have replaced ``sys.stdout``)."""
    data = memoryview(line.encode())
    while data:
        data = data[os.write(1, data) :]


def main(argv: list[str]) -> int:
    nonce_file, root, *tests = argv
    trusted_proc.harden()
    nonce = trusted_proc.take_nonce(nonce_file)
    root = os.path.realpath(root)
    sources = {}
    for path in tests:  # read once, before any repository code runs
        with open(path, encoding="utf-8", errors="replace") as fh:
            sources[path] = fh.read()
    names = repo_names(root)
    signal.signal(signal.SIGALRM, _alarm)
    os.chdir(root)
    results: dict[str, str] = {}
    errors: dict[str, str] = {}
    for index, path in enumerate(tests):
        got, why = run_file(root, path, sources[path], index, names)
        results.update(got)
        errors.update(why)
    trusted_proc.kill_descendants()
    payload = json.dumps({"results": results, "errors": errors})
    _print_result(f"\n{MARKER} {trusted_proc.sign(nonce, payload)} {payload}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
