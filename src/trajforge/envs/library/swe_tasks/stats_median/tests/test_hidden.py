import numstats


def _raises(fn, arg):
    try:
        fn(arg)
    except ValueError:
        return True
    return False


def test_median():
    assert numstats.median([3, 1, 2]) == 2
    assert numstats.median([4, 1, 3, 2]) == 2.5
    assert numstats.median([7]) == 7
    assert _raises(numstats.median, [])


def test_mode():
    assert numstats.mode([1, 2, 2, 3]) == 2
    assert numstats.mode([5, 1, 5, 1, 9]) == 1
    assert _raises(numstats.mode, [])


def test_mean():
    assert numstats.mean([1, 2, 3, 4]) == 2.5
