import re


def slugify(title: str) -> str:
    """A URL slug: lower case letters and digits, runs of other characters become one dash."""
    out = []
    for ch in title.lower():
        out.append(ch if ch.isalnum() else "-")
    return re.sub(r"-+", "-", "".join(out)).strip("-")
