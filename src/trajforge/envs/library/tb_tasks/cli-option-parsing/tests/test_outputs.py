import os
import shutil
import subprocess

TOOL = "/app/bin/mkbackup"
assert os.access(TOOL, os.X_OK), "not executable"


def run(*args):
    p = subprocess.run([TOOL, *args], cwd="/app", capture_output=True, text=True, timeout=20)
    return p.returncode, p.stdout, p.stderr


shutil.rmtree("/app/backups", ignore_errors=True)
code, out, err = run("-n", "docs/a.txt")
assert (code, out) == (0, "would copy docs/a.txt -> /app/backups/a.txt.bak\n"), (code, out, err)
assert not os.path.exists("/app/backups/a.txt.bak")
code, out, err = run("docs/a.txt", "docs/b.txt")
assert code == 0, (code, err)
assert out == "copied docs/a.txt -> /app/backups/a.txt.bak\ncopied docs/b.txt -> /app/backups/b.txt.bak\n", (
    out
)
assert open("/app/backups/b.txt.bak").read() == "beta\n"
code, out, err = run("-o", "/app/out dir", "docs/missing.txt", "docs/a.txt")
assert code == 1 and "mkbackup: no such file: docs/missing.txt" in err, (code, err)
assert out == "copied docs/a.txt -> /app/out dir/a.txt.bak\n", out
assert open("/app/out dir/a.txt.bak").read() == "alpha\n"
for bad in ([], ["-x", "docs/a.txt"], ["-o"], ["-n"]):
    code, out, err = run(*bad)
    assert code == 64 and err.startswith("usage:") and out == "", (bad, code, out, err)
