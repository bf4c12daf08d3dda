from textkit import slugify


def test_collapses_runs():
    assert slugify("Hello   World") == "hello-world"
    assert slugify("a -- b") == "a-b"


def test_strips_edges():
    assert slugify("  Intro! ") == "intro"
    assert slugify("...Chapter 2: The End...") == "chapter-2-the-end"


def test_keeps_simple():
    assert slugify("Hello World") == "hello-world"
    assert slugify("abc123") == "abc123"
