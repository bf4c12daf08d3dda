def count(text):
    """(lines, words, chars) of a text, as wc counts them."""
    return text.count("\n"), len(text.split()), len(text)
