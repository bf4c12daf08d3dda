"""Start Hermes Agent's ``batch_runner.py`` (the reference runner of issue 29) with two additions,
both made before it starts and inherited by its forked pool workers. Run by
``reference_runner.py`` with the interpreter of ``.venv-ref`` (``make bench-ref``); never imported
by trajforge, and it copies nothing of Hermes: it only calls it.

1. A toolset distribution ``TF_REF_DISTRIBUTION`` that offers the ``terminal`` toolset alone (its
   own distributions all add ``file`` or more; the ``terminal`` toolset is its ``terminal`` and
   ``process`` tools).
2. A network guard (``sys.addaudithook``): a name lookup or a connection to anything but loopback
   is written to ``TF_REF_NET_LOG`` and refused, so the benchmark sees every attempt and none
   leaves the machine. Unix sockets (nscd) are let through.

The arguments are ``batch_runner.py``'s own (python-fire): ``--dataset_file=...`` and so on.
"""

import os
import sys

# This file's directory comes first on sys.path; none of its modules may shadow one of Hermes's.
sys.path.pop(0)

LOOPBACK = {"127.0.0.1", "localhost", "::1", "", None}
NET_LOG = os.environ["TF_REF_NET_LOG"]


def _guard(event: str, args: tuple[object, ...]) -> None:
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect" and isinstance(args[1], tuple):
        host = args[1][0]
    else:
        return
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host in LOOPBACK:
        return
    with open(NET_LOG, "a") as log:
        log.write(f"{os.getpid()} {event} {host}\n")
    raise OSError(f"reference benchmark: no network beyond loopback (refused {event} {host})")


sys.addaudithook(_guard)

import fire  # noqa: E402
import toolset_distributions  # noqa: E402

toolset_distributions.DISTRIBUTIONS[os.environ["TF_REF_DISTRIBUTION"]] = {
    "description": "the terminal toolset alone (trajforge's benchmarks: --toolsets terminal)",
    "toolsets": {"terminal": 100},
}

import batch_runner  # noqa: E402

fire.Fire(batch_runner.main)
