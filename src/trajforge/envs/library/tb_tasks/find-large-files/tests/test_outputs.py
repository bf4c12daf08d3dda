with open("/app/large.txt") as fh:
    got = fh.read().splitlines()
assert got == ["a/b/big.bin", "c/just-over.dat", "d/.hidden.img", "space name.log"], got
