import json

with open("/app/people.json") as fh:
    got = json.load(fh)
assert got == [
    {"name": "Adams, Jo", "age": 45, "city": "Oslo"},
    {"name": "Bo", "age": 7, "city": "New York, NY"},
    {"name": "Zoe", "age": 31, "city": "Lisbon"},
], got
