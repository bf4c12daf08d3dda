from numerals import to_roman


def test_subtractive():
    assert to_roman(4) == "IV"
    assert to_roman(9) == "IX"
    assert to_roman(14) == "XIV"


def test_large():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"
    assert to_roman(444) == "CDXLIV"


def test_additive_and_range():
    assert to_roman(3) == "III"
    assert to_roman(2023 - 2000) == "XXIII"
    for bad in (0, 4000, -1):
        try:
            to_roman(bad)
        except ValueError:
            continue
        raise AssertionError(f"no ValueError for {bad}")
