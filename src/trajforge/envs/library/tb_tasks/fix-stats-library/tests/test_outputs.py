import sys

sys.path.insert(0, "/app")
from stats_lib import median, moving_average, percentile

data = [9, 2, 7, 4]
assert median(data) == 5.5 and data == [9, 2, 7, 4], data
assert median([5]) == 5 and median([1, 2]) == 1.5
assert median([3, 1, 2]) == 2
assert percentile([15, 20, 35, 40, 50], 5) == 15
assert percentile([15, 20, 35, 40, 50], 30) == 20
assert percentile([15, 20, 35, 40, 50], 40) == 20
assert percentile([15, 20, 35, 40, 50], 100) == 50
assert percentile(list(range(1, 101)), 95) == 95
assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
assert moving_average([1, 2, 3], 3) == [2.0]
assert moving_average([1, 2], 3) == []
