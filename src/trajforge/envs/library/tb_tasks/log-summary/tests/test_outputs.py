from pathlib import Path

expected = "api 3\nworker 2\nbilling 1\n"
got = Path("/app/summary.txt").read_text()
assert got.strip().splitlines() == expected.strip().splitlines(), got
print("ok")
