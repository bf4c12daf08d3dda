import subprocess


def run(*args):
    p = subprocess.run(
        ["python3", "-m", "wordtool", *args], cwd="/app", capture_output=True, text=True, timeout=30
    )
    return p.returncode, p.stdout, p.stderr


code, out, err = run("samples/a.txt")
assert (code, out) == (0, "samples/a.txt: 2 3 14\n"), (code, out, err)
code, out, err = run("samples/a.txt", "samples/b.txt")
assert (code, out) == (0, "samples/a.txt: 2 3 14\nsamples/b.txt: 1 4 23\ntotal: 3 7 37\n"), (code, out, err)
code, out, err = run("samples/b.txt", "nope.txt", "samples/a.txt")
assert code == 2, code
assert out == "samples/b.txt: 1 4 23\nsamples/a.txt: 2 3 14\ntotal: 3 7 37\n", out
assert "wordtool: cannot read nope.txt" in err, err
