import os

got = sorted(os.listdir("/app/configs"))
assert got == ["app.conf", "index.txt", "logging.conf", "web.conf"], got
assert open("/app/configs/web.conf").read() == "port=80\n"
assert open("/app/configs/logging.conf").read() == "level=info\n"
assert open("/app/configs/app.conf").read() == "user=app\n"
index = open("/app/configs/index.txt").read().splitlines()
assert index == [
    "app.conf etc/app.conf",
    "logging.conf etc/app/logging.conf",
    "web.conf srv/web/conf.d/web.conf",
], index
for name in ("etc", "srv", "home", "stage"):
    assert not os.path.exists(os.path.join("/app", name)), f"{name}/ extracted into /app"
for top, _, files in os.walk("/app"):
    if top != "/app/configs":
        assert not [f for f in files if f.endswith(".conf")], (top, files)
