from timefmt import format_duration, parse_duration


def test_parse():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45s") == 45
    assert parse_duration("2h5s") == 7205
    assert parse_duration("1d2h3m4s") == 93784
    assert parse_duration("0s") == 0


def test_parse_rejects():
    for bad in ["", "5", "1x", "3m1h", "1h 2m", "h", "1.5h", "1h1h"]:
        try:
            parse_duration(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_round_trip():
    for n in (0, 1, 59, 61, 3600, 3725, 90061):
        assert parse_duration(format_duration(n)) == n


def test_format():
    assert format_duration(3725) == "1h2m5s"
    assert format_duration(0) == "0s"
