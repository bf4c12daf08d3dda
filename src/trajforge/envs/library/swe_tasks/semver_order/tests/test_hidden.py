from versions import is_newer, latest


def test_numeric_parts():
    assert is_newer("1.10.0", "1.9.0")
    assert not is_newer("1.9.0", "1.10.0")
    assert latest(["1.2.0", "1.10.1", "1.9.9"]) == "1.10.1"


def test_missing_parts():
    assert not is_newer("1.2", "1.2.0")
    assert not is_newer("1.2.0", "1.2")
    assert is_newer("2", "1.99.99")
    assert latest(["1.2", "1.2.0"]) == "1.2"


def test_simple():
    assert is_newer("2.0.0", "1.0.0")
    assert not is_newer("1.0.0", "1.0.0")
