def slugify(title: str) -> str:
    """A URL slug: lower case letters and digits, other characters become dashes."""
    out = []
    for ch in title.lower():
        out.append(ch if ch.isalnum() else "-")
    return "".join(out)
