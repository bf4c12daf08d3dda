"""An agent-written env that attacks the host from its env host, as one scenario.

``run(work)`` writes the env, approves it in a fresh agent env store, loads it (its code runs in
the env host's bubblewrap sandbox) and returns what each attempt saw, next to a control: the same
code run as a plain host process, which does read the secret, write the canary and reach the
loopback server -- so the attacks are real and only the sandbox stops them. Run as a script
(``python envhost_attacks.py WORK``) it prints that report as JSON: the unprivileged variant of
the test runs it as ``nobody``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import trajforge

ATTACKS = r"""
import json, os, socket, subprocess

OBSERVED = {{}}


def attempt(name, fn):
    try:
        OBSERVED[name] = {{"ok": True, "value": repr(fn())[:300]}}
    except BaseException as exc:
        OBSERVED[name] = {{"ok": False, "error": (type(exc).__name__ + ": " + str(exc))[:300]}}


def _read_host_secret():
    with open({secret!r}) as f:
        return f.read()


def _write(path):
    with open(path, "w") as f:
        f.write("pwned")
    return path


def _connect():
    s = socket.create_connection(("127.0.0.1", {port}), timeout=3)
    s.sendall(b"hello")
    s.close()
    return "connected"


# import-time side effects: each one is an attack on the host
attempt("read_host_secret", _read_host_secret)
attempt("read_etc_shadow", lambda: open("/etc/shadow").read())
attempt("list_host_home", lambda: sorted(os.listdir({home!r})))
attempt("write_host_canary", lambda: _write({canary!r}))
attempt("read_beside_trajforge", lambda: sorted(os.listdir({beside!r})))
attempt("write_trajforge_source", lambda: _write({probe!r}))
attempt("connect_host_loopback", _connect)
attempt("signal_host_process", lambda: os.kill({host_pid}, 0))
attempt("uid", os.getuid)
attempt("subprocess_id", lambda: subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip())
attempt("write_own_run_dir", lambda: _write(os.path.join(os.getcwd(), "fine.txt")))

from trajforge.envs import BaseEnv


class Evil(BaseEnv):
    name = "evil"
    description = "tries everything at import"

    def generate(self, index, *, split):
        return {{"id": str(index), "prompt": json.dumps(OBSERVED)}}

    async def compute_reward(self, item, result, ctx):
        return 0.0
"""


def attack_source(*, secret: Path, canary: Path, probe: Path, home: Path, port: int) -> str:
    beside = Path(trajforge.__file__).resolve().parents[2]  # a checkout's root, or the venv's lib/
    return ATTACKS.format(
        secret=str(secret),
        canary=str(canary),
        probe=str(probe),
        home=str(home),
        port=port,
        host_pid=os.getpid(),
        beside=str(beside),
    )


class _Listener:
    """A loopback TCP server that counts who reached it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _python_path() -> str:
    return os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))


def run(work: Path) -> dict[str, Any]:
    from trajforge.envs import load_env
    from trajforge.envs.sandboxed.store import AgentEnvStore

    token = secrets.token_hex(6)
    secret = work / "secret.txt"
    secret.write_text(f"TOPSECRET-{token}")
    secret.chmod(0o600)
    home = Path(os.path.expanduser("~"))
    probe = Path(trajforge.__file__).parent / f".envhost-probe-{token}"
    listener = _Listener()
    try:
        # the control: the same code as a plain process on the host
        control_src = attack_source(
            secret=secret,
            canary=work / "control-canary.txt",
            probe=work / "control-probe.txt",
            home=home,
            port=listener.port,
        )
        (work / "control.py").write_text(control_src + "\nprint(json.dumps(OBSERVED))\n")
        done = subprocess.run(
            [sys.executable, str(work / "control.py")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=work,
            env={**os.environ, "PYTHONPATH": _python_path()},
        )
        control = json.loads(done.stdout.strip().splitlines()[-1])
        accepted_by_control = listener.accepted

        # the env host: approved, loaded, asked for an item (which carries what it saw)
        canary = work / "canary.txt"
        store = AgentEnvStore(work / "store")
        source = attack_source(secret=secret, canary=canary, probe=probe, home=home, port=listener.port)
        version = store.ingest("evil", source.encode(), source="test")
        store.approve(version.name, version.sha256, by="test")
        env: Any = load_env(str(version.ref("Evil")))
        try:
            sandboxed = json.loads(env.eval_items(1)[0]["prompt"])
            log_tail = env.host.log_tail()
        finally:
            env.close()
        return {
            "control": control,
            "sandboxed": sandboxed,
            "accepted_by_control": accepted_by_control,
            "accepted_from_sandbox": listener.accepted - accepted_by_control,
            "canary_exists": canary.exists(),
            "probe_exists": probe.exists(),
            "secret": secret.read_text(),
            "host_uid": os.getuid(),
            "log_tail": log_tail,
        }
    finally:
        listener.close()
        if probe.exists():
            probe.unlink()


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]))))
