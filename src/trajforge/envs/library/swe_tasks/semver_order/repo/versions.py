def is_newer(a: str, b: str) -> bool:
    """True when version ``a`` is strictly newer than ``b``."""
    return a > b


def latest(versions: list[str]) -> str:
    """The newest of ``versions`` (the first one on ties)."""
    best = versions[0]
    for v in versions[1:]:
        if is_newer(v, best):
            best = v
    return best
