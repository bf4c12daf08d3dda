"""The bash scripts the exec agent runs and the notes it tells the model about the shell.

Why a module of their own: they are shell and English, not C, and reading them here (with the
reasons beside each line) is easier than reading them as C string literals. ``native_agent``
writes them into ``agent_scripts.h`` when it builds ``exec_agent.c``, the one exec agent; nothing
else runs them. They must stay ASCII (the header embeds them byte for byte). The notes are format
strings for the agent's ``printf``: ``INTERFERED`` and ``INTRUDED`` hold one ``%d`` (the other
process's pid), ``ENDED`` and ``ENDED_UNSTARTED`` one ``%d`` (the shell's status),
``PROCESS_LIMIT`` one ``%d`` (the limit), ``CWD_MISSING`` one ``%s``; no other ``%``.
"""

from __future__ import annotations

# A fresh command (``"fresh": true``: a verifier's) runs in a bash of its own, outside the session:
# the limits set first, then the command file sourced (no ARG_MAX limit, exact bytes).
WRAPPER = r"""
ulimit -f "$TF_LIMIT_FSIZE_KB" 2>/dev/null
ulimit -t "$TF_LIMIT_CPU_S" 2>/dev/null
[ -n "$TF_LIMIT_AS_KB" ] && ulimit -v "$TF_LIMIT_AS_KB" 2>/dev/null
[ -n "$TF_LIMIT_NPROC" ] && ulimit -u "$TF_LIMIT_NPROC" 2>/dev/null
unset TF_LIMIT_FSIZE_KB TF_LIMIT_CPU_S TF_LIMIT_AS_KB TF_LIMIT_NPROC
. "$1"
"""

# The resident shell of a session: ``bash`` with no arguments (``ps`` shows a plain ``bash``),
# reading this script from fd 0 (a memory file the agent wrote it into, the C agent's ``loop_script``),
# fd 1 its end of a Unix socket pair whose other end only the agent holds, fd 2 /dev/null. The
# script is one line, one brace group: its redirections move the socket to fd 10, a copy bash
# itself makes close-on-exec, and put /dev/null on fd 0 and fd 1: no program a command runs
# inherits the channel. Over it the agent sends one line per command (its number, a fresh nonce,
# and "c" when a cwd file comes with it) and the loop answers ``NONCE go`` when it took the line,
# ``NONCE RC`` after the command. A subshell a command forks keeps fd 10 (a fork is the loop's
# copy): so the agent takes a line only from the loop's own process, as the kernel attests it
# (SO_PASSCRED: every message arrives with its sender's pid, and a stream never merges two
# senders' data), and treats anything else as an impostor.
#
# A command runs in this very shell -- so its functions, aliases, plain variables, options, cwd,
# traps and ``source``d environments stay -- as ``bash -c`` would run it, and nothing of the loop
# shows (issue 39: the model must see a shell, not the harness): its text is read into
# ``BASH_EXECUTION_STRING`` (where ``bash -c`` keeps its command) and ``eval``'d on line 1 of the
# script, so errors read ``bash: line N: ...`` with N the command's own line, ``$0`` is ``bash``,
# ``$BASH_SOURCE`` and ``$FUNCNAME`` are empty and ``return`` is the error it is in a terminal.
# The loop's own variables (``__tf_*``) exist only between commands: a function that unsets itself
# and them returns the previous command's exit code, so ``$?`` is what a terminal shows, and the
# nonce comes back after the command from a here-string fd (closed for the command; bash keeps its
# copy close-on-exec). No trap of the loop's: an ``exit``, a ``set -e`` failure or a ``set -u``
# error ends the shell as it ends ``bash -c``, and the next command gets a new shell from the
# snapshot of the session taken after the last command that finished.
#
# The command's stdin is /dev/null and its output goes into a FIFO of its own, named by its nonce
# (in a directory commands cannot list); ``go`` is said once the FIFO is open (at fd 95 of the
# braces around the command, which the command itself does not see), and the agent then removes
# its name, so a process that learns it later cannot open it. Until the command's own
# redirections, stdout and stderr are /dev/null: an xtrace of the loop's lines, or a DEBUG trap the
# session keeps, write nothing into the output. bash saves the loop's fds for the duration
# (close-on-exec) and puts them back whatever ``exec`` redirection the command made. Around each
# command the loop turns off (and then restores) the options that would break its own statements
# (errexit, nounset, allexport, xtrace, verbose), writes a snapshot of the session that a
# restarted shell sources, and only then reports the status. Every loop statement is a
# ``builtin``: a command's ``cd``/``read``/``printf`` functions do not reach it. Options are saved
# as $SHELLOPTS/$BASHOPTS, two strings: ``set +o``/``shopt -p`` would write ~80 lines, each a
# system call, after every command.
#
# ``@TF_...@`` are filled in per shell by the agent (``loop_script`` in ``exec_agent.c``):
# the command directory and the snapshot (quoted), ``new`` or ``restore``, the nonce of the
# ``ready`` line, and the ``ulimit`` statements of the sandbox's limits.
_LOOP_LINES = r"""
{
__tf_u=$_;
@TF_LIMITS@
builtin shopt -s expand_aliases;
if [ @TF_MODE@ = restore ]; then
  builtin . @TF_SNAP@ </dev/null >/dev/null 2>&1;
  builtin trap - DEBUG ERR RETURN;
  builtin mapfile -t __tf_all < <(builtin compgen -A shopt);
  for __tf_o in "${__tf_all[@]}"; do
    [[ :$__tf_bo: == *:"$__tf_o":* ]] && builtin shopt -s "$__tf_o" || builtin shopt -u "$__tf_o";
  done 2>/dev/null;
  builtin mapfile -t __tf_all < <(builtin compgen -A setopt);
  for __tf_o in "${__tf_all[@]}"; do
    [[ $__tf_o == @(history|monitor|noexec|onecmd|emacs|vi|privileged) ]] && builtin continue;
    [[ :$__tf_so: == *:"$__tf_o":* ]] && builtin set -o "$__tf_o" || builtin set +o "$__tf_o";
  done 2>/dev/null;
fi;
__tf_rc=${__tf_rc:-0} __tf_f=$-;
builtin set +euavx --;
builtin unset -v __tf_all __tf_o __tf_so __tf_bo BASH_EXECUTION_STRING;
builtin export -n __tf_rc __tf_f __tf_u 2>/dev/null;
builtin printf '%s ready\n' @TF_NONCE@ >&10;
while IFS=' ' builtin read -r -u 10 __tf_n __tf_nonce __tf_cwd; do
  if [[ $__tf_cwd == c ]]; then
    IFS= builtin read -r -d '' __tf_cwd <@TF_DIR@/c$__tf_n.cwd;
    if ! builtin cd -- "$__tf_cwd" 2>/dev/null; then
      builtin printf '%s cwd\n' "$__tf_nonce" >&10;
      builtin continue;
    fi;
  fi;
  {
    builtin printf '%s go\n' "$__tf_nonce" >&10;
    if builtin unset -n BASH_EXECUTION_STRING 2>/dev/null; then
      IFS= builtin read -r -d '' BASH_EXECUTION_STRING <@TF_DIR@/c$__tf_n.sh;
    else
      IFS= builtin read -r -d '' __tf_cmd <@TF_DIR@/c$__tf_n.sh;
    fi;
    __tf_r() { builtin unset -f __tf_r; builtin unset -v __tf_n __tf_nonce __tf_cwd __tf_rc __tf_f __tf_u; builtin return "$1"; };
    [[ -n ${__tf_f//[!euavx]/} ]] && builtin set -"${__tf_f//[!euavx]/}";
    if (( __tf_rc )); then
      __tf_r "$__tf_rc" "$__tf_u" || builtin eval "${__tf_cmd-$BASH_EXECUTION_STRING}" >&95 2>&1 95>&- 96<&-;
    else
      __tf_r 0 "$__tf_u";
      builtin eval "${__tf_cmd-$BASH_EXECUTION_STRING}" >&95 2>&1 95>&- 96<&-;
    fi;
    __tf_rc=$? __tf_f=$-;
    builtin unset -v __tf_cmd;
    builtin unset -n BASH_EXECUTION_STRING 2>/dev/null || builtin :;
    builtin export -n __tf_rc __tf_f 2>/dev/null || builtin :;
    {
      builtin declare -p; builtin declare -f; builtin declare -F; builtin alias -p; builtin trap -p; builtin umask -p;
      builtin printf 'builtin cd -- %q\n__tf_so=%q __tf_bo=%q\n' "$PWD" "$SHELLOPTS" "$BASHOPTS";
    } >|@TF_SNAP@ 2>/dev/null || builtin :;
    builtin set +euavx;
    IFS=' ' builtin read -r -u 96 __tf_nonce __tf_u;
  } 95>@TF_DIR@/o$__tf_nonce 96<<<"$__tf_nonce $__tf_u" </dev/null >/dev/null;
  builtin export -n __tf_nonce __tf_u 2>/dev/null;
  builtin printf '%s %s\n' "$__tf_nonce" "$__tf_rc" >&10;
done;
} 1>/dev/null 0</dev/null
"""
# One line: ``eval`` numbers a command's lines from the line it is called on, and on line 1 the
# command's first line is ``line 1`` in bash's messages, as under ``bash -c``.
LOOP = " ".join(line.strip() for line in _LOOP_LINES.strip().splitlines()) + "\n"
# The notes: the agent's own words about a command, sent in its answer's ``notes`` (one sentence
# each, no brackets or newlines), never inside ``output``: what a command printed stays exactly
# what it printed, and the output cap counts output alone. The host shows each to the model after
# the output, on a line of its own in brackets (``ExecResult.shown``).
#
# A command can read the loop's nonce (it runs in the loop's shell) and write the status line
# itself: its call then ends early. Its real end shows up later, while the next command waits.
OVERRAN = (
    "the command before this one reported its end early (it wrote the shell's status line "
    "itself) and went on running in the shell until now"
)
# ... and that earlier command then ended the shell before this one could start.
OVERRAN_ENDED = "... and then ended the shell: this command did not run"
# A process other than the shell wrote on the shell's channel (a job a command left, or a
# program given a copy of the channel): what this command reports cannot be trusted.
INTERFERED = (
    "a process other than the shell (pid %d) wrote on the shell's channel to the exec agent: it "
    "was killed, and so were the shell and what this command started; this command's exit code and "
    "output are not reported (it may have been interfered with); the next command runs in a new "
    "shell with the session as it was before this command"
)
INTRUDED = (
    "a process other than the shell (pid %d) wrote on the shell's channel to the exec agent since "
    "the last command: it was killed, and this command runs in a new shell with the session as it "
    "was after the last command"
)
# The shell never took the command (stopped, still running an earlier one, or its request was
# taken by another process): whatever reached the command's output was not the command's.
NOT_STARTED = (
    "the shell did not start this command within its timeout (a process stopped it or took its "
    "request, or the command before this one was still running in it): nothing that reached its "
    "output is reported; the shell was restarted: the next command runs with the session as it "
    "was before this command"
)
RESTARTED = "the shell was restarted: the next command runs with the session as it was before this command"
# The command ended the shell (``exit``, ``set -e``, ``exec``, a signal): ``%d`` its status.
ENDED = (
    "the shell ended (status %d); the next command runs in a new shell with the session as it "
    "was before this command"
)
ENDED_UNSTARTED = (
    "the shell ended (status %d) before this command started: it did not run; the next command "
    "runs in a new shell with the session as it was after the last command that finished"
)
RESTORE_FAILED = (
    "the shell's saved state could not be restored: this command runs in a fresh shell (start "
    "environment, workdir)"
)
# ``%d``: the sandbox's process limit. Said by the agent when it finds the sandbox near it.
PROCESS_LIMIT = (
    "the sandbox reached its process limit (%d); every process in it, background jobs included, was killed"
)
# ``%s``: the directory as Python's repr() writes it. The command did not run.
CWD_MISSING = "cwd does not exist: %s"
# The notes above, one per line: what a test checks a note against (each must be a sentence the
# agent may say, never inside output).
NOTES = (
    OVERRAN,
    OVERRAN_ENDED,
    INTERFERED,
    INTRUDED,
    NOT_STARTED,
    RESTARTED,
    ENDED,
    ENDED_UNSTARTED,
    RESTORE_FAILED,
    PROCESS_LIMIT,
    CWD_MISSING,
)
