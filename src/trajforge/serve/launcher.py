"""Start ``trajforge serve`` as a child process on a free loopback port, and stop it again.

The default-model mode of ``trajforge run``/``batch`` talks to the embedded policy over the same
HTTP path as to any endpoint, so it needs a server it owns::

    async with LocalServer(model_dir) as server:
        client = OpenAIChatModel(base_url=server.openai_base_url, model=server.model_name, ...)

Readiness is observed, never guessed: the child binds port 0 and prints the address it got (no
race for a "free" port), then ``/health`` must answer. If the child dies first, the error carries
the tail of its log. The child's log goes to a file (``log_path``) so a long run never blocks on
a full pipe. The child's stdin is a pipe this process never writes to, and the child stops when
it closes (``--exit-with-stdin``), so a server never outlives the process that started it, even
one killed with SIGKILL.

The child writes its token for ``/v1/load_weights`` into a file in a directory only this user can
enter (``--token-file``, a fresh ``mkdtemp``); it is read once the server is ready and sent by
:meth:`LocalServer.auth_headers`. The token is never on a command line or in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import aiohttp

from trajforge.serve.config import READY_PREFIX, check_model_dir
from trajforge.spawn import spawn

_CLI = "from trajforge.cli.main import main; main()"


class LocalServerError(RuntimeError):
    """The child server could not be started (the message includes the end of its log)."""


class LocalServer:
    """Async context manager owning one ``trajforge serve`` child process."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        parser: str = "hermes",
        max_batch: int = 8,
        device: str = "auto",
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 300.0,
        log_path: str | Path | None = None,
    ) -> None:
        self.model_path = check_model_dir(Path(model_path))
        self.host = host
        self.port = port
        self.parser = parser
        self.max_batch = max_batch
        self.device = device
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else None
        self.base_url: str | None = None
        self.model_name = self.model_path.name
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._drain: asyncio.Task[None] | None = None
        self._token_dir: Path | None = None
        self.token: str | None = None

    def auth_headers(self) -> dict[str, str]:
        """The header the server's mutating endpoints require."""
        if self.token is None:
            raise LocalServerError("the server is not running")
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def openai_base_url(self) -> str:
        """The URL OpenAI clients take (``.../v1``)."""
        if self.base_url is None:
            raise LocalServerError("the server is not running")
        return self.base_url + "/v1"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-c",
            _CLI,
            "serve",
            "--model-path",
            str(self.model_path),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--tool-call-parser",
            self.parser,
            "--max-batch",
            str(self.max_batch),
            "--device",
            self.device,
            *self.extra_args,
        ]

    async def start(self) -> str:
        """Spawn the child and wait until it serves; returns ``base_url``."""
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="trajforge-serve-")) / "serve.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._token_dir = Path(tempfile.mkdtemp(prefix="trajforge-serve-token-"))  # 0700, ours
        token_file = self._token_dir / "token"
        self._proc = await spawn(
            *self.command(),
            "--token-file",
            str(token_file),
            "--exit-with-stdin",  # with the pipe below; command() alone is a plain serve command
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            stdin=asyncio.subprocess.PIPE,  # never written: its end closing stops the child (--exit-with-stdin)
        )
        try:
            self.base_url = await asyncio.wait_for(self._read_address(), self.startup_timeout)
            self.token = await asyncio.to_thread(_read_token, token_file)
            await self._wait_healthy()
        except TimeoutError:
            await self.stop()
            raise LocalServerError(
                f"trajforge serve did not become ready within {self.startup_timeout:.0f}s; "
                f"log {self.log_path}:\n{self._log_tail()}"
            ) from None
        except BaseException:
            await self.stop()
            raise
        self._drain = asyncio.create_task(self._drain_stdout(), name="trajforge-serve-stdout")
        return self.base_url

    async def _read_address(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            line = await self._proc.stdout.readline()
            if not line:
                code = await self._proc.wait()
                raise LocalServerError(
                    f"trajforge serve exited with code {code} before it was ready; "
                    f"log {self.log_path}:\n{self._log_tail()}"
                )
            text = line.decode("utf-8", "replace").strip()
            if text.startswith(READY_PREFIX):
                return text[len(READY_PREFIX) :].split()[0]

    async def _wait_healthy(self) -> None:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{self.base_url}/health") as resp:
                        if resp.status == 200:
                            return
                if self._proc is not None and self._proc.returncode is not None:
                    raise LocalServerError(f"trajforge serve exited:\n{self._log_tail()}")
                await asyncio.sleep(0.05)

    async def _drain_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while await self._proc.stdout.readline():
            pass

    async def health(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"{self.base_url}/health") as resp:
            resp.raise_for_status()
            body: dict[str, Any] = await resp.json()
            return body

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            self._drain = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._token_dir is not None:
            shutil.rmtree(self._token_dir, ignore_errors=True)
            self._token_dir = None
        self.base_url = None
        self.token = None

    def _log_tail(self, limit: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace")

    async def __aenter__(self) -> LocalServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _read_token(path: Path) -> str:
    """The token the child wrote before its ready line (a short line; anything else is an error)."""
    with open(path, "rb") as f:
        token = f.read(1024).decode("ascii", "replace").strip()
    if not token:
        raise LocalServerError("trajforge serve wrote no token")
    return token
