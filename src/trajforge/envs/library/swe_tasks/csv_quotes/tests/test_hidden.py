from tabular import parse, parse_line


def test_quoted_comma():
    assert parse_line('"Smith, John",42') == ["Smith, John", "42"]


def test_escaped_quote():
    assert parse_line('a,"say ""hi""",c') == ["a", 'say "hi"', "c"]


def test_plain():
    assert parse_line("a,b,,d") == ["a", "b", "", "d"]
    assert parse("x,y\n1,2\n") == [["x", "y"], ["1", "2"]]
