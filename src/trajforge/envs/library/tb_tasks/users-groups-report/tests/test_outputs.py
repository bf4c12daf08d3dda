got = open("/app/users.txt").read().splitlines()
assert got == [
    "ann 1000 ann,sudo,users,www-data",
    "bob 1001 docker,sudo,users",
    "zoe 1002 docker,users,zoe",
], got
