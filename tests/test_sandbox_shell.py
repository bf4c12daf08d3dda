"""The resident shell: a session keeps what a person's terminal keeps, and survives what a command
does to it (``exit``, ``exec``, a signal, a timeout, redirections and traps left behind)."""

from __future__ import annotations

import shlex
import shutil

import pytest

from trajforge.sandbox import SandboxConfig, agent_scripts, create_sandbox_factory

BACKENDS = ["bwrap", "local"]


def _needs(kind: str) -> None:
    if kind == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")


@pytest.fixture(params=BACKENDS)
async def sandbox(request, tmp_path):
    _needs(request.param)
    factory = create_sandbox_factory(
        SandboxConfig(kind=request.param, root_dir=str(tmp_path / "sb"), command_timeout_s=20)
    )
    sb = await factory.create("shell")
    try:
        yield sb
    finally:
        await sb.close()
        await factory.aclose()


async def _out(sb, command: str, **kw) -> str:
    res = await sb.exec(command, **kw)
    assert res.exit_code == 0 and not res.timed_out, res
    return res.output


async def test_functions_aliases_plain_variables_and_options_carry_over(sandbox):
    await _out(
        sandbox,
        "greet() { echo \"hello $1\"; }; alias ll='echo listed'; PLAIN=kept; declare -a ARR=(a 'b c'); "
        "declare -A MAP=([k]=v); set -o pipefail; shopt -s extglob; umask 027; cd /tmp; NUM=41; "
        "declare -i NUM; readonly FIXED=1",
    )
    out = await _out(
        sandbox,
        'greet you; ll; echo "$PLAIN ${ARR[1]} ${MAP[k]}"; false | true; echo "pipefail:$?"; '
        "x=abc; echo ${x/@(b)/B}; umask; pwd; NUM+=1; echo $NUM; (FIXED=2) 2>/dev/null || echo readonly-kept",
    )
    assert out == "hello you\nlisted\nkept b c v\npipefail:1\naBc\n0027\n/tmp\n42\nreadonly-kept\n"
    assert await _out(sandbox, "env | grep -c '^PLAIN=' || true") == "0\n"  # plain stays unexported


async def test_a_sourced_virtualenv_activates_and_deactivates_across_calls(sandbox, tmp_path):
    made = await sandbox.exec("python3 -m venv --without-pip venv && echo made", timeout=60)
    if "made" not in made.output:
        pytest.skip(f"python3 -m venv is not available here: {made.output[-300:]}")
    await _out(sandbox, "source venv/bin/activate")
    out = await _out(sandbox, 'command -v python; echo "$VIRTUAL_ENV"; type -t deactivate')
    lines = out.splitlines()
    assert lines[0].endswith("/venv/bin/python") and lines[1].endswith("/venv") and lines[2] == "function", (
        out
    )
    await _out(sandbox, "deactivate")
    out = await _out(sandbox, 'command -v python3; echo "[${VIRTUAL_ENV-}]"; type -t deactivate || echo gone')
    assert "/venv/" not in out and out.endswith("[]\ngone\n"), out


async def test_exit_errexit_and_nounset_end_the_shell_as_they_end_bash_c(sandbox):
    """``exit N``, a ``set -e`` failure and a ``set -u`` error end the shell as they end ``bash -c``
    (no trap of the harness's catches them: a command would see it in ``trap -p``). The call gets
    the exit code, what the command printed (its own EXIT trap's output included) and a note; the
    next command runs in a new shell with the session as it was after the last command that
    finished."""
    await _out(sandbox, "f() { echo f; }; A=1; cd /tmp")
    res = await sandbox.exec("B=2; cd /; exit 3")
    assert res.exit_code == 3 and res.output == "", res  # the note is not the command's output
    assert res.notes == (agent_scripts.ENDED % 3,), res
    assert res.shown == "\n[" + agent_scripts.ENDED % 3 + "]\n"  # what the model reads
    assert await _out(sandbox, 'f; echo "$A[${B-}]"; pwd') == "f\n1[]\n/tmp\n"
    res = await sandbox.exec("trap 'echo bye' EXIT; exit 4")  # the command's own trap runs, as in bash
    assert res.exit_code == 4 and res.output.startswith("bye\n"), res
    assert await _out(sandbox, "trap -p; echo none") == "none\n"
    await _out(sandbox, "set -e")
    res = await sandbox.exec("C=3; false; echo not-reached")
    assert res.exit_code == 1 and "not-reached" not in res.output, res
    assert await _out(sandbox, 'echo "[${C-}]" "$-"') == "[] ehBs\n"  # set -e, set before, stays
    res = await sandbox.exec("set +e; set -u; echo $UNDEFINED_VAR; echo not-reached")
    assert res.exit_code != 0 and res.output.startswith("bash: line 1: UNDEFINED_VAR: unbound variable\n"), (
        res
    )
    assert await _out(sandbox, "set +eu; f") == "f\n"


@pytest.mark.parametrize("kind", BACKENDS)
async def test_signals_the_launcher_ignored_or_blocked_reach_no_command(kind, tmp_path):
    """Started under ``nohup`` or as a script's background job, trajforge ignores SIGHUP (SIGINT,
    SIGQUIT); a disposition that is ignored or a signal that is blocked passes to every child, and
    bash can neither trap nor reset a signal ignored at its start (``trap -p`` lists it as
    ``trap -- '' SIGHUP``). A command in the sandbox starts as in a terminal: none of either."""
    import signal

    _needs(kind)
    ignored = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGHUP, signal.SIGQUIT)}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        factory = create_sandbox_factory(
            SandboxConfig(kind=kind, root_dir=str(tmp_path / "sb"), command_timeout_s=20)
        )
        sb = await factory.create("signals")
    finally:
        for number, was in ignored.items():
            signal.signal(number, was)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        out = await _out(sb, "trap -p; grep -E '^Sig(Blk|Ign)' /proc/self/status")
        assert "trap --" not in out, out
        masks = dict(line.split(":\t") for line in out.splitlines())
        assert int(masks["SigBlk"], 16) == 0, out
        hup, quit_ = 1 << (signal.SIGHUP - 1), 1 << (signal.SIGQUIT - 1)
        assert int(masks["SigIgn"], 16) & (hup | quit_) == 0, out
    finally:
        await sb.close()
        await factory.aclose()


async def test_an_execd_or_killed_shell_is_replaced_and_the_model_is_told(sandbox):
    await _out(sandbox, "f() { echo f; }; cd /tmp; X=1")
    res = await sandbox.exec("Y=lost; exec sleep 0.1")
    assert res.exit_code == 0 and res.notes == (agent_scripts.ENDED % 0,) and res.output == "", res
    assert await _out(sandbox, 'f; echo "$X[${Y-}]"; pwd') == "f\n1[]\n/tmp\n"
    res = await sandbox.exec("Y=lost; kill -9 $$")
    assert res.exit_code == -9 and res.notes == (agent_scripts.ENDED % -9,) and res.output == "", res
    assert await _out(sandbox, 'f; echo "$X[${Y-}]"') == "f\n1[]\n"


async def test_a_timeout_kills_the_command_and_restores_the_shell(sandbox):
    """A builtin loop runs in the shell itself: the shell dies with it and comes back from the
    snapshot; a background job of an earlier command is not the timed-out command's and lives."""
    await _out(sandbox, "f() { echo f; }; sleep 1021 & echo started")
    res = await sandbox.exec("Z=lost; while :; do :; done", timeout=1)
    assert res.timed_out and res.exit_code is None and res.notes == (agent_scripts.RESTARTED,), res
    assert await _out(sandbox, 'f; echo "[${Z-}]"; ps -eo args | grep -c "^sleep 1021"') == "f\n[]\n1\n"
    res = await sandbox.exec("sleep 1022 & sleep 1023", timeout=1)
    assert res.timed_out, res
    assert await _out(sandbox, "ps -eo args | grep -c '^sleep 102[23]' || true") == "0\n"


async def test_what_a_command_leaves_on_its_shell_does_not_break_the_next_one(sandbox):
    """stdin is /dev/null; exec redirections are undone after each command; traps, options and a
    shadowed ``cd``/``printf``/``read`` do not reach the loop that runs the commands."""
    res = await sandbox.exec('cat; read -r x; echo "read:$?"')
    assert res.output == "read:1\n", res
    await _out(sandbox, "exec >/dev/null 2>&1 0</etc/hostname; echo hidden")
    await _out(
        sandbox, "trap 'echo debug-trap' DEBUG; trap 'echo err-trap' ERR; set -o noclobber -o allexport"
    )
    await _out(sandbox, "trap - DEBUG ERR; cd() { echo fake-cd; }; printf() { echo fake; }; read() { :; }")
    await _out(sandbox, "exec 5>/dev/null; IFS=:; set -f; shopt -s failglob nullglob")
    res = await sandbox.exec("echo visible; echo err >&2; builtin cd /tmp; builtin pwd; echo *")
    assert res.output == "visible\nerr\n/tmp\n*\n", res
    assert (
        await _out(sandbox, "env | grep -c '^__tf' || true") == "0\n"
    )  # allexport exported no loop variable


async def test_a_snapshot_that_breaks_the_shell_gives_a_fresh_one(sandbox):
    """A DEBUG trap armed to kill the shell is in the snapshot: the restored shell dies while it
    sources it, and the next command runs in a fresh shell, told so."""
    await _out(sandbox, "f() { echo f; }; trap '[ -e \"$TMPDIR/armed\" ] && kill -9 $$' DEBUG")
    res = await sandbox.exec('touch "$TMPDIR/armed"')
    assert "as it was before this command" in res.notes[-1], res
    res = await sandbox.exec("type -t f || echo no-f; echo ran")
    assert "could not be restored" in res.notes[0] and res.output == "no-f\nran\n", res


async def test_cwd_argument_and_background_output(sandbox):
    await _out(sandbox, "mkdir -p sub/dir && cd sub")
    assert await _out(sandbox, "pwd", cwd="dir") == f"{sandbox.workdir}/sub/dir\n"
    res = await sandbox.exec("pwd", cwd="missing")
    assert res.exit_code == 1 and res.output == "" and res.notes == ("cwd does not exist: 'missing'",), res
    assert await _out(sandbox, "pwd") == f"{sandbox.workdir}/sub/dir\n"
    assert await _out(sandbox, "(sleep 0.5; echo LATE-LINE) & echo now") == "now\n"
    assert await _out(sandbox, "sleep 1; echo later") == "later\n"  # its output stayed in its own call
    await _out(sandbox, "sleep 0.2 & echo started")
    assert await _out(sandbox, "wait; echo waited:$?") == "waited:0\n"  # one shell: jobs are its own


async def test_a_fresh_command_sees_none_of_the_session(sandbox):
    await _out(sandbox, "f() { echo f; }; export X=1; alias a=b; cd /tmp")
    res = await sandbox.exec_fresh('type -t f || echo no-f; echo "[${X-}]"; pwd', timeout=10)
    assert res.output == f"no-f\n[]\n{sandbox.workdir}\n", res


async def test_a_command_that_closes_the_loops_own_fds_costs_only_its_shell(sandbox):
    """The loop's channel to the agent is an fd of the shell the command runs in (fd 10, and bash
    keeps its saved fds above it while the command runs): closing them all leaves a shell that can
    never report.
    The command's timeout ends it like any other, and the session goes on from its snapshot."""
    await _out(sandbox, "f() { echo f; }")
    # Before: the agent waited for the mute shell to exit (sleep 1000), past the command's
    # timeout and the host's grace, and the sandbox was declared broken.
    res = await sandbox.exec(
        'for n in $(seq 3 60); do eval "exec $n>&-"; done 2>/dev/null; sleep 1000', timeout=5
    )
    assert res.timed_out and res.notes == (agent_scripts.RESTARTED,), res
    assert await _out(sandbox, "f") == "f\n"


async def test_a_command_with_a_lone_surrogate_reaches_the_shell_as_its_byte(sandbox):
    """A model's JSON can carry "\\udc80"; the request goes out as JSON all the same and the shell
    gets the byte it stands for (surrogateescape), as before the resident shell."""
    assert await _out(sandbox, "printf '%s' '\udc80' | od -An -tx1 | tr -d ' '") == "80\n"


async def test_the_shell_knows_itself_without_a_user_lookup(sandbox):
    """SHELL and HOME are in the start environment: a terminal has both, and without them every
    new bash looks the user up through NSS (nscd sockets, nsswitch.conf, a module loaded for a uid
    that is not in /etc/passwd), ~0.9 ms of CPU per rollout's shell."""
    out = await _out(sandbox, 'echo "$SHELL"; [ -n "$HOME" ] && echo home')
    assert out == "/bin/bash\nhome\n"


# What a command sees of its shell is what ``bash -c`` shows it: each of these prints and exits
# alike in the session and in ``bash -c`` run by the same sandbox.
LIKE_BASH_C = [
    "nosuch_command",
    "wait %1",
    "cd /nonexistent",
    "echo one\nnosuch_two\necho three",
    "echo $((1/0))",
    "readonly R=1; R=2",
    "return 3",
    'echo "$0|${BASH_SOURCE[*]}|${FUNCNAME[*]}|$LINENO|$#"',
    "caller; echo $?",
    "kill %1",
    "fg",
    "false | true; echo ${PIPESTATUS[*]}",
    "set -o | md5sum",
]


async def test_a_command_sees_the_shell_bash_c_shows_it(sandbox):
    """Errors read ``bash: line N: ...`` with N the command's own line (they named the harness's
    command file), ``$0`` is ``bash``, ``$BASH_SOURCE`` and ``$FUNCNAME`` are empty, ``return``
    at the top is the error it is in a terminal (it ended the sourced file). Two differences are
    bash's own and written down in docs/fidelity.md: a syntax error names ``eval`` where
    ``bash -c`` says ``-c``, and ``$?`` at a command's start is the last command's status, as in
    a terminal (``bash -c`` starts at 0)."""
    for command in LIKE_BASH_C:
        ours = await sandbox.exec(command)
        ref = await sandbox.exec(f"bash -c {shlex.quote(command)}")
        assert (ours.exit_code, ours.output) == (ref.exit_code, ref.output), command
    ours = await sandbox.exec("if then")
    assert ours.exit_code == 2 and ours.output.startswith(
        "bash: eval: line 1: syntax error near unexpected token"
    ), ours
    assert (await sandbox.exec("false")).exit_code == 1
    assert await _out(sandbox, "echo $?") == "1\n"


# What would name the harness in what a command prints: its paths, its variables, its trap.
HARNESS = ("__tf", "trajforge", "TF_LIMIT", "TF_AGENT", "/run/trajforge", ".trajforge-session", "snapshot.sh")


async def test_nothing_of_the_harness_shows_to_a_command(sandbox):
    """Issue 39: ``set`` listed nine ``__tf_*`` variables, ``trap -p`` the loop's EXIT trap,
    ``$BASH_SOURCE`` was the command's file, ``ps`` the loop's script and the agent's options.
    Now every way a command can list its shell's state shows the session's own and bash's, and
    the session keeps what a terminal keeps (the command before planted some of each)."""
    await _out(
        sandbox,
        "g() { echo g; }; alias ll='echo ll'; V=1; export W=2; trap 'echo usr1' USR1; set -o pipefail; "
        "sleep 300 & cd /tmp",
    )
    probes = [
        "set",
        "declare -p",
        "declare -f",
        "declare -F",
        "compgen -v",
        "compgen -A function",
        "trap -p",
        "alias -p",
        "env",
        "export -p",
        'echo "$BASH_SOURCE|$0|$BASH_EXECUTION_STRING"',
        "shopt -p; set +o",
        "jobs -l",
        "tr '\\0' ' ' < /proc/$$/cmdline",
        "tr '\\0' '\\n' < /proc/$$/environ",
        "nosuch_command_at_all",
        "wait %9",
    ]
    if sandbox.config.kind != "local":  # the local backend is the host: its processes, its mounts
        probes += [
            "ps -ef",
            "ps aux",
            "top -bn1",
            "mount",
            "df -a",
            "cat /proc/self/mountinfo",
            "ls / /run",
            "find / -maxdepth 2",
        ]
        probes += ["tr '\\0' ' ' < /proc/$PPID/cmdline", "tr '\\0' ' ' < /proc/1/cmdline"]
    for probe in probes:
        res = await sandbox.exec(probe)
        leaked = [word for word in HARNESS if word in res.output.replace(probe, "")]
        assert not leaked, (probe, leaked, res.output[-2000:])
    kept = await _out(
        sandbox, "g; ll; echo $V $W; trap -p USR1; shopt -o pipefail | tr -s ' \t' ' '; jobs; pwd"
    )
    assert kept == (
        "g\nll\n1 2\ntrap -- 'echo usr1' SIGUSR1\npipefail on\n[1]+  Running                 sleep 300 &  (wd: ~)\n/tmp\n"
    ), kept
