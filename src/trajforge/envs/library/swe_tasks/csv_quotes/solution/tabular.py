import csv


def parse_line(line: str) -> list[str]:
    """The fields of one CSV line (without its line ending)."""
    return next(csv.reader([line]))


def parse(text: str) -> list[list[str]]:
    return [parse_line(line) for line in text.splitlines() if line]
