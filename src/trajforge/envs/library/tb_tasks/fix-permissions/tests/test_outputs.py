import os
import stat

want = {
    ".": 0o755,
    "bin": 0o755,
    "data": 0o755,
    "data/nested": 0o755,
    "secrets": 0o700,
    "bin/start.sh": 0o755,
    "bin/stop.sh": 0o755,
    "data/users.csv": 0o644,
    "data/nested/old.csv": 0o644,
    "secrets/key.pem": 0o600,
    "README": 0o644,
}
root = "/app/srv"
got = {}
for top, dirs, files in os.walk(root):
    for name in [".", *dirs, *files] if top == root else [*dirs, *files]:
        path = os.path.normpath(os.path.join(top, name))
        got[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
assert got == want, {k: oct(v) for k, v in got.items()}
assert open("/app/srv/secrets/key.pem").read() == "-----BEGIN KEY-----\nabc\n-----END KEY-----\n"
assert open("/app/srv/bin/start.sh").read() == "#!/bin/sh\necho start\n"
