#!/bin/bash
python3 - <<'PY'
groups, members = {}, {}
for line in open("/app/etc/group"):
    name, _, gid, users = line.rstrip("\n").split(":")
    groups[gid] = name
    for u in filter(None, users.split(",")):
        members.setdefault(u, set()).add(name)
out = []
for line in open("/app/etc/passwd"):
    user, _, uid, gid, _, _, shell = line.rstrip("\n").split(":")
    if int(uid) < 1000 or int(uid) == 65534 or shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false"):
        continue
    mine = members.get(user, set()) | {groups[gid]}
    out.append((int(uid), f"{user} {uid} {','.join(sorted(mine))}"))
open("/app/users.txt", "w").write("".join(line + "\n" for _, line in sorted(out)))
PY
