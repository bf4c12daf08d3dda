import wordstats


def test_top_words_order():
    text = "the cat and the hat; The bat and THE cat"
    assert wordstats.top_words(text, 3) == [("the", 4), ("and", 2), ("cat", 2)]


def test_top_words_edges():
    assert wordstats.top_words("b a b", 10) == [("b", 2), ("a", 1)]
    assert wordstats.top_words("", 2) == []
    assert wordstats.top_words("x y", 0) == []
    try:
        wordstats.top_words("x", -1)
    except ValueError:
        pass
    else:
        raise AssertionError("n < 0 must raise ValueError")


def test_count_words():
    assert wordstats.count_words("Hello, hello world!") == 3
