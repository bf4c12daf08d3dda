import os
import subprocess
import tempfile

assert os.access("/app/render", os.X_OK)


def render(template, env):
    d = tempfile.mkdtemp()
    t, v = os.path.join(d, "t"), os.path.join(d, "v")
    open(t, "w").write(template)
    open(v, "w").write(env)
    p = subprocess.run(["/app/render", t, v], capture_output=True, text=True, timeout=20)
    return p.returncode, p.stdout, p.stderr


p = subprocess.run(
    ["/app/render", "/app/app.conf.tmpl", "/app/prod.env"], capture_output=True, text=True, timeout=20
)
assert p.returncode == 0, p
assert p.stdout == (
    "# generated for prod\nlisten 0.0.0.0:8443\nworkers \nprice $5 and $PATH stay\n"
    "url=https://example.com/a?b=1=2\n"
), p.stdout
assert render("a=${A:-x} b=${B:-y}${C:-}", "A=1\n") == (0, "a=1 b=y", "")
assert render("$${A} ${A}", "A= spaced = \n") == (0, "${A}  spaced = ", "")
code, out, err = render("x ${MISSING} ${OTHER}", "OTHER=1\n")
assert code == 1 and out == "" and err.strip() == "render: MISSING is not set", (code, out, err)
