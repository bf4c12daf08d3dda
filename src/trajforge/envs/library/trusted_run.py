"""Running a trusted verifier program inside a finished rollout's sandbox and reading its signed
result (the host side of :mod:`trajforge.envs.library.trusted_proc`).

The program and ``trusted_proc.py`` are copied into a fresh directory with a random name, with a
nonce file beside them; the program reads and deletes the nonce before it starts anything of
the model's, and prints ``MARKER <hmac> <json>``. Only a line whose HMAC verifies with our nonce
counts: text printed by the code under test, a line copied from an earlier run, or a result
edited after the program printed it, is ignored. The program is run as an argv (``exec``: it
replaces the shell, so its only ancestor is the sandbox's non-dumpable exec agent).
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from trajforge.envs.library import trusted_proc

if TYPE_CHECKING:
    from trajforge.envs.verifier import VerifierContext, VerifierExec


@dataclass(frozen=True)
class TrustedResult:
    data: dict[str, Any] | None  # the verified result, or None
    run: VerifierExec
    why: str  # why there is no result ("" when there is one)


def _source(name: str) -> bytes:
    return resources.files("trajforge.envs.library").joinpath(name).read_bytes()


async def run_trusted(
    ctx: VerifierContext,
    where: str,
    program: str,
    args: list[str],
    *,
    marker: str,
    timeout: float,  # noqa: ASYNC109 (the program's deadline, enforced in the sandbox)
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    extra_files: tuple[str, ...] = (),
    extra_data: Mapping[str, bytes] | None = None,
) -> TrustedResult:
    """Run ``program`` (a file of this package, with ``extra_files`` of it and ``extra_data``,
    files by name and content, beside it) from a fresh directory under ``where``.

    Refused in a context whose reward commands run in the rollout's session (``reward_shell:
    session``): the rollout's processes are then still alive, and a signed result means nothing
    when the code under test could be running beside the program that signs it."""
    if ctx.shell == "session":
        from trajforge.envs.verifier import VerifierError

        raise VerifierError(
            f"{program} is a trusted verifier: it runs only after every process of the rollout was "
            "stopped, which reward_shell: session keeps alive; use reward_shell: fresh for this env"
        )
    box = f"{where.rstrip('/')}/.trajforge-trusted-{secrets.token_hex(8)}"
    nonce = secrets.token_hex(32)
    for name in (program, "trusted_proc.py", *extra_files):
        await ctx.write_file(f"{box}/{name}", _source(name))
    for name, data in (extra_data or {}).items():
        await ctx.write_file(f"{box}/{name}", data)
    await ctx.write_file(f"{box}/nonce", nonce)
    try:
        res = await ctx.exec(
            ["python3", "-I", "-S", f"{box}/{program}", f"{box}/nonce", *args],
            timeout=timeout,
            cwd=cwd,
            env=env,
        )
    finally:
        await ctx.exec(["rm", "-rf", "--", box])
    key = nonce.encode()
    for line in res.text.splitlines():
        parts = line.split(" ", 2)
        if (
            len(parts) == 3
            and parts[0] == marker
            and hmac.compare_digest(parts[1], trusted_proc.sign(key, parts[2]))
        ):
            data = json.loads(parts[2])
            if isinstance(data, dict):
                return TrustedResult(data, res, "")
    tail = (res.stderr or res.stdout).decode(errors="replace").strip()[-800:]
    why = "timed out" if res.timed_out else f"exit code {res.exit_code}"
    return TrustedResult(None, res, f"{program} gave no signed result ({why}): {tail}")
