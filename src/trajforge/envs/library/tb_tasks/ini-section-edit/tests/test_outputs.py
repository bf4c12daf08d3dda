want = """; site configuration
[server]
host = 127.0.0.1
port = 9090
# port = 1234 was the old value
workers = 4

[metrics]
port = 8080
path = /metrics

[server.tls]
port = 8443
"""
got = open("/app/site.ini").read()
assert got == want, got
