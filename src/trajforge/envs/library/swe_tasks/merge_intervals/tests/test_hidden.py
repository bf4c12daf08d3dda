from intervals import merge


def test_unsorted():
    assert merge([(5, 8), (1, 3), (2, 4)]) == [(1, 4), (5, 8)]


def test_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]
    assert merge([(7, 9), (1, 2), (2, 7)]) == [(1, 9)]


def test_sorted_disjoint_and_overlap():
    assert merge([]) == []
    assert merge([(1, 2), (4, 6)]) == [(1, 2), (4, 6)]
    assert merge([(1, 5), (2, 3)]) == [(1, 5)]
