import re

WORD = re.compile(r"[a-z]+")


def count_words(text: str) -> int:
    """How many words ``text`` has (runs of letters, case-insensitive)."""
    return len(WORD.findall(text.lower()))
