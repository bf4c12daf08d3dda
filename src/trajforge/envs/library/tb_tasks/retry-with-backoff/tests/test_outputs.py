import os
import subprocess
import tempfile
import time

work = tempfile.mkdtemp()
flaky = os.path.join(work, "flaky.sh")
with open(flaky, "w") as fh:
    fh.write(
        '#!/bin/bash\nn=$(( $(cat "$1" 2>/dev/null || echo 0) + 1 ))\necho $n > "$1"\n'
        'echo "try $n"\n[ $n -ge "$2" ] && exit 0\nexit 7\n'
    )
os.chmod(flaky, 0o755)


def retry(*args):
    start = time.monotonic()
    p = subprocess.run(["bash", "/app/retry.sh", *args], capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - start


count = os.path.join(work, "c1")
code, out, err, _ = retry("5", "0", flaky, count, "3")
assert code == 0 and out == "try 1\ntry 2\ntry 3\n", (code, out, err)
assert err.splitlines() == ["attempt 1 failed with status 7", "attempt 2 failed with status 7"], err
count = os.path.join(work, "c2")
code, out, err, took = retry("3", "0.1", flaky, count, "10")
assert code == 7 and open(count).read().strip() == "3", (code, err)
assert err.splitlines() == [f"attempt {i} failed with status 7" for i in (1, 2, 3)], err
assert took >= 0.3, took  # waits 0.1 then 0.2
arg_file = os.path.join(work, "args")
code, out, err, _ = retry("2", "0", "sh", "-c", 'printf "%s|" "$@" > "$0"', arg_file, "a b", "c")
assert code == 0 and open(arg_file).read() == "a b|c|", open(arg_file).read()
code, _, err, _ = retry("1", "0", "false")
assert code == 1 and err.strip() == "attempt 1 failed with status 1", (code, err)
