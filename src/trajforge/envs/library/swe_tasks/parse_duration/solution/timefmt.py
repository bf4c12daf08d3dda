import re

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_PATTERN = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def format_duration(seconds: int) -> str:
    """``3725`` -> ``1h2m5s``; zero is ``0s``."""
    if seconds < 0:
        raise ValueError("negative duration")
    parts = []
    for unit, size in _UNITS:
        value, seconds = divmod(seconds, size)
        if value:
            parts.append(f"{value}{unit}")
    return "".join(parts) or "0s"


def parse_duration(text: str) -> int:
    """``1h2m5s`` -> ``3725``."""
    match = _PATTERN.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(g) * size for g, (_, size) in zip(match.groups(), _UNITS, strict=True) if g)
