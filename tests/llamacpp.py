"""llama.cpp for the tests: both of its servers built from PyPI's source, and the tiny policy as GGUF.

Issue 37 measured trajforge against the inference servers people run; these are the two that build
on a CPU machine without a network: llama-cpp-python's server (``python -m llama_cpp.server``, the
PyPI package installed from its sdist) and llama.cpp's own ``llama-server``. llama.cpp is compiled
once, with CMake, from the llama.cpp that sdist vendors (CPU only, ``GGML_NATIVE=OFF`` so a cache
built on one CI machine runs on another, shared libraries): ``llama-server`` links them, and
llama-cpp-python is installed with ``LLAMA_BUILD=OFF`` (its own option: no second compile of the
same source) and loads them through ``LLAMA_CPP_LIB_PATH`` (its own variable), so both servers run
the very code its sdist pins. The embedded tiny policy is converted with llama.cpp's ``convert_hf_to_gguf.py``
through :mod:`trajforge.models.tiny.gguf` (which tells it our tokenizer's pre-tokenizer).

Everything lives under one directory outside the repository (``~/.cache/trajforge/llamacpp/VERSION``,
or ``$TRAJFORGE_LLAMACPP_HOME/VERSION``), shared by checkouts: only the first build on a machine
pays (one llama.cpp compile, no longer two: the server's and the bindings' own). Each
step has a stamp and is skipped when its output is there; the GGUF is named by a hash of the
weights and the converter step, so new weights convert again. ``make test`` runs ``prepare``
(``make llamacpp``) before pytest, so the builds run outside any test's timeout.

Where a build cannot run (no CMake or C++ compiler), ``prepare`` records why and exits 0, and the
tests that need the servers skip saying so (:func:`why_not`); a build that starts and fails stops
``make test`` (a broken build is not a reason to skip). Stdlib only.

    python tests/llamacpp.py prepare|status|paths
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

VERSION = "0.3.36"
"""llama-cpp-python's version on PyPI; its sdist vendors the llama.cpp both servers are built from."""

REPO = Path(__file__).resolve().parents[1]
HOME = (
    Path(os.environ.get("TRAJFORGE_LLAMACPP_HOME") or Path.home() / ".cache" / "trajforge" / "llamacpp")
    / VERSION
)
SDIST = HOME / f"llama_cpp_python-{VERSION}.tar.gz"
SOURCE = HOME / f"llama_cpp_python-{VERSION}"
LLAMA_CPP = SOURCE / "vendor" / "llama.cpp"
SERVER_BUILD = HOME / "build-shared"
LLAMA_SERVER = SERVER_BUILD / "bin" / "llama-server"
LIB_DIR = SERVER_BUILD / "bin"
"""Where the build puts ``libllama.so`` and ggml's libraries (llama.cpp's CMake: beside its programs)."""
PY_VENV = HOME / "venv-shared"
PY_SERVER = PY_VENV / "bin" / "python"
WHY_NOT = HOME / "why-not"  # written when this machine cannot build: the tests skip with it
TIMINGS = HOME / "timings.json"
JOBS = os.environ.get("TRAJFORGE_LLAMACPP_JOBS", "2")

# CPU only, portable, nothing fetched at build time (no curl/openssl, no prebuilt web UI).
COMMON_CMAKE = (
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
SERVER_CMAKE = (
    "-DCMAKE_BUILD_TYPE=Release",
    *COMMON_CMAKE,
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DBUILD_SHARED_LIBS=ON",
)
PY_CMAKE = ("-DLLAMA_BUILD=OFF", "-DLLAVA_BUILD=OFF")
"""llama-cpp-python's own options: install the bindings and the server, compile nothing (the
libraries are :data:`LIB_DIR`'s)."""
WEIGHTS = REPO / "src" / "trajforge" / "models" / "tiny" / "weights"
_GGUF_INPUTS = (
    *(WEIGHTS / n for n in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")),
    WEIGHTS / "chat_template.jinja",
    REPO / "src" / "trajforge" / "models" / "tiny" / "gguf.py",
)


def _stamp(name: str) -> Path:
    return HOME / f".{name}-done"


def gguf_path() -> Path:
    """The tiny policy's GGUF, named by a hash of what it is converted from."""
    digest = hashlib.sha256()
    for path in _GGUF_INPUTS:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return HOME / f"tiny-{digest.hexdigest()[:16]}.gguf"


@dataclass(frozen=True)
class Built:
    """Where the built pieces are."""

    llama_server: Path
    python: Path  # llama-cpp-python's virtualenv interpreter
    gguf: Path
    template: Path  # the shipped chat template (also inside the GGUF)

    def python_env(self) -> dict[str, str]:
        """The environment :attr:`python` runs llama_cpp in: the bindings load the libraries of the
        one llama.cpp compile (``LLAMA_CPP_LIB_PATH``; the package ships none of its own)."""
        return dict(os.environ, LLAMA_CPP_LIB_PATH=str(LIB_DIR))


def why_not() -> str | None:
    """Why the llama.cpp servers cannot be used here (None: they are built and ready)."""
    if WHY_NOT.is_file():
        return WHY_NOT.read_text().strip()
    missing = [
        str(p) for p in (LLAMA_SERVER, LIB_DIR / "libllama.so", PY_SERVER, gguf_path()) if not p.exists()
    ]
    if missing or not _stamp("python-shared").exists():
        return f"llama.cpp is not built ({', '.join(missing) or 'llama-cpp-python'}): run `make llamacpp`"
    return None


def built() -> Built:
    reason = why_not()
    if reason:
        raise RuntimeError(reason)
    return Built(LLAMA_SERVER, PY_SERVER, gguf_path(), WEIGHTS / "chat_template.jinja")


# -- building -------------------------------------------------------------------------------------


def _run(argv: list[str], *, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run a build step niced (the machine is shared), its output to ``log``; raise with its tail."""
    with open(log, "ab") as out:
        done = subprocess.run(
            ["nice", "-n", "10", *argv], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, check=False
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"llama.cpp build step failed ({' '.join(argv[:3])} ...), see {log}:\n{tail}")


def _toolchain_problem() -> str | None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        return (
            f"no {' or '.join(missing)} on this machine to build llama.cpp "
            "(Debian: apt-get install cmake g++; `make system-deps` does it)"
        )
    return None


def _source() -> None:
    if _stamp("source").exists():
        return
    HOME.mkdir(parents=True, exist_ok=True)
    if not SDIST.exists():
        # the index's source distribution, never a prebuilt wheel: both servers build from its vendor/
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        _run([*cmd, f"llama-cpp-python=={VERSION}", "-d", str(HOME)], log=HOME / "source.log")
    with tarfile.open(SDIST) as tar:
        tar.extractall(HOME, filter="data")
    _stamp("source").touch()


def _llama_server() -> None:
    if _stamp("server-shared").exists() and LLAMA_SERVER.exists():
        return
    log = HOME / "build-server.log"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(LLAMA_CPP), "-B", str(SERVER_BUILD), *generator, *SERVER_CMAKE], log=log)
    _run(["cmake", "--build", str(SERVER_BUILD), "--target", "llama-server", "llama", "-j", JOBS], log=log)
    _stamp("server-shared").touch()


def _python_server() -> None:
    if _stamp("python-shared").exists() and PY_SERVER.exists():
        return
    log = HOME / "build-python.log"
    if not (PY_VENV / "bin" / "pip").exists():
        _run([sys.executable, "-m", "venv", "--clear", str(PY_VENV)], log=log)
    env = dict(os.environ, CMAKE_ARGS=" ".join(PY_CMAKE))
    # the sdist already here (the one whose vendored llama.cpp was compiled), its server's extras
    _run(
        [str(PY_SERVER), "-m", "pip", "install", "-q", "--no-cache-dir", f"{SDIST}[server]"],
        log=log,
        env=env,
    )
    _stamp("python-shared").touch()


def _gguf() -> None:
    out = gguf_path()
    if out.exists():
        return
    tmp = out.with_suffix(".tmp")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    cmd = [
        sys.executable,
        "-m",
        "trajforge.models.tiny.gguf",
        "--llama-cpp",
        str(LLAMA_CPP),
        "--out",
        str(tmp),
    ]
    _run(cmd, log=HOME / "gguf.log", env=env)
    tmp.rename(out)


def prepare() -> None:
    HOME.mkdir(parents=True, exist_ok=True)
    problem = _toolchain_problem()
    if problem:
        WHY_NOT.write_text(problem + "\n")
        print(f"llama.cpp: not built: {problem}")
        return
    WHY_NOT.unlink(missing_ok=True)
    timings = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    for name, step in (
        ("source", _source),
        ("server", _llama_server),
        ("python", _python_server),
        ("gguf", _gguf),
    ):
        started = time.monotonic()
        step()
        took = time.monotonic() - started
        if took > 1:
            timings[name] = round(took, 1)
            TIMINGS.write_text(json.dumps(timings, indent=2))
    print(f"llama.cpp {VERSION}: llama-server, llama-cpp-python and {gguf_path().name} ready in {HOME}")


# -- serving, for the tests --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(
    argv: list[str], ready: str, log: Path, *, env: dict[str, str] | None = None, ready_s: float = 120.0
) -> Iterator[None]:
    """A server process (its output in ``log``) for the block, once ``ready`` answers 200; stopped
    after it (killed when it does not stop). Also the benchmark's way to run vLLM and SGLang."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        _wait_ready(proc, ready, log, ready_s)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def tiny_tasks_batch(
    dataset: Path, out: Path, name: str, base_url: str | None = None, **settings: Any
) -> list[dict[str, Any]]:
    """``trajforge batch --env tiny_tasks`` over ``dataset`` (greedy, the terminal and file tools)
    against ``base_url`` serving the policy as ``tiny`` (None: the embedded policy); every line of
    the run, whatever its status, in dataset order. ``settings`` override the batch's."""
    from trajforge.batch.config import load_config
    from trajforge.batch.runner import run_batch
    from trajforge.export.formats import OUTPUT_FILES

    endpoint = {"model": "tiny", "base_url": base_url, "api_key_env": ""} if base_url else {}
    base = {"toolsets": ["terminal", "file"], "env": "tiny_tasks", "progress": "none", "temperature": 0.0}
    fields = {**base, "max_tokens": 256, **endpoint, **settings}
    cfg = load_config(None, {"dataset": dataset, "run_name": name, "output_dir": out, **fields})
    run_dir = (await run_batch(cfg)).run_dir
    lines = [
        orjson.loads(x)
        for file in OUTPUT_FILES
        if (run_dir / file).exists()
        for x in (run_dir / file).read_bytes().splitlines()
    ]
    return sorted(lines, key=lambda line: line["prompt_index"])


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the server exited ({proc.returncode}) before it answered: {log.read_text()[-2000:]}"
            )
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer {url} within {timeout_s:g}s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def serve(
    kind: str, log_dir: Path, *, slots: int = 4, alias: str = "tiny", extra: tuple[str, ...] = ()
) -> Iterator[str]:
    """Serve the tiny GGUF with ``kind`` (``llama-server`` or ``llama-cpp-python``) on a free loopback
    port as model ``alias``; yields the ``.../v1`` base URL. One thread each: the machine is shared."""
    b = built()
    port = free_port()
    if kind == "llama-server":
        # --jinja: the GGUF's (shipped) template renders chats and tools; -c: slots x the model's 1024;
        # -fa off -ctk/-ctv f32: float32 attention, or logprobs drift up to 1e-3 from the torch model's
        # (flash attention and an f16 KV cache, measured: 1.1e-3 at worst over 30 episodes; 1.2e-5 without)
        argv = [str(b.llama_server), "-m", str(b.gguf), "--host", "127.0.0.1", "--port", str(port), "--jinja"]
        argv += ["-c", str(1024 * slots), "-np", str(slots), "-t", "1", "--no-webui"]
        argv += ["-fa", "off", "-ctk", "f32", "-ctv", "f32", "--alias", alias, *extra]
        ready = f"http://127.0.0.1:{port}/health"
        env = None
    elif kind == "llama-cpp-python":
        argv = [str(b.python), "-m", "llama_cpp.server", "--model", str(b.gguf), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--n_ctx", "1024", "--n_threads", "1", "--model_alias", alias, *extra]
        ready = f"http://127.0.0.1:{port}/v1/models"
        env = b.python_env()
    else:
        raise ValueError(f"unknown llama.cpp server {kind!r}")
    with running(argv, ready, log_dir / f"{kind}-{port}.log", env=env):
        yield f"http://127.0.0.1:{port}/v1"


def main(argv: list[str]) -> None:
    command = argv[0] if argv else "status"
    if command == "prepare":
        prepare()
    elif command == "status":
        print(why_not() or f"ready: {built()}")
    elif command == "paths":
        print(json.dumps({k: str(v) for k, v in vars(built()).items()}, indent=2))
    else:
        raise SystemExit(f"usage: python {sys.argv[0]} prepare|status|paths")


if __name__ == "__main__":
    main(sys.argv[1:])
