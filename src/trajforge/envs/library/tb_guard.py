"""The verdict guard of terminal_bench's verifier (``tb_guard.c``), compiled on this machine.

``tb_verify.py`` preloads it into test.sh's bash (and nothing else): the verdict files' descriptors
become close-on-exec there and bash non-dumpable, so the programs test.sh runs -- the agent's
among them -- cannot reach the verdict (the C file says why this takes code inside bash). It is
built here, as the native exec agent is, by the host's C compiler, once per process; the sandbox
sees the host's ``/usr``, so the object loads there (under docker an image with another C library
refuses it, and the verifier then refuses to judge: see ``tb_verify``).
"""

from __future__ import annotations

import functools
from importlib import resources

from trajforge.sandbox.native_agent import CompileError, compile_c, compiler

SOURCE = "tb_guard.c"
NAME = "tb_guard.so"
_FLAGS = ("-O2", "-std=gnu11", "-shared", "-fPIC", "-Wall", "-Wextra")


class GuardUnavailableError(RuntimeError):
    """The guard cannot be built here: terminal_bench's verifier cannot keep its verdict safe."""


@functools.cache
def build_guard(extra_flags: tuple[str, ...] = ()) -> bytes:
    """The compiled guard (blocking, ~0.1 s, then cached). Raises :class:`GuardUnavailableError`
    saying what to install when there is no C compiler or it does not compile."""
    cc = compiler()
    if cc is None:
        raise GuardUnavailableError(
            "terminal_bench's verifier needs a C compiler on this machine (apt-get install gcc): it "
            "builds a small guard that keeps test.sh's verdict out of reach of the programs the "
            "tests run, and judges nothing without it"
        )
    source = resources.files("trajforge.envs.library").joinpath(SOURCE).read_bytes()
    try:
        return compile_c(cc, SOURCE, source, NAME, (*_FLAGS, *extra_flags))
    except CompileError as exc:
        raise GuardUnavailableError(
            f"terminal_bench's verifier guard did not compile with {cc} ({exc}); it judges nothing without it"
        ) from None
