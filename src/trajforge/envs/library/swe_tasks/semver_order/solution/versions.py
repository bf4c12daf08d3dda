def _key(v: str) -> tuple[int, int, int]:
    parts = [int(p) for p in v.split(".")]
    parts += [0] * (3 - len(parts))
    return (parts[0], parts[1], parts[2])


def is_newer(a: str, b: str) -> bool:
    """True when version ``a`` is strictly newer than ``b``."""
    return _key(a) > _key(b)


def latest(versions: list[str]) -> str:
    """The newest of ``versions`` (the first one on ties)."""
    best = versions[0]
    for v in versions[1:]:
        if is_newer(v, best):
            best = v
    return best
