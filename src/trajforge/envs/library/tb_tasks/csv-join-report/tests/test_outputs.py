import csv

rows = list(csv.reader(open("/app/report.csv", newline="")))
assert rows == [
    ["name", "country", "purchases", "total"],
    ["Ann", "NO", "2", "15.00"],
    ["Chen", "CN", "1", "15.00"],
    ["Smith, Bob", "US", "2", "15.00"],
    ["Dee", "US", "0", "0.00"],
], rows
