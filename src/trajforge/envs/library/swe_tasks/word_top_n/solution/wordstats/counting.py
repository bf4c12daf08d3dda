import re
from collections import Counter

WORD = re.compile(r"[a-z]+")


def count_words(text: str) -> int:
    """How many words ``text`` has (runs of letters, case-insensitive)."""
    return len(WORD.findall(text.lower()))


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    """The ``n`` most frequent words, most frequent first, ties alphabetical."""
    if n < 0:
        raise ValueError("n must not be negative")
    counts = Counter(WORD.findall(text.lower()))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
