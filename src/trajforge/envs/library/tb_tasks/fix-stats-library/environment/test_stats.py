from stats_lib import median, moving_average, percentile

assert median([3, 1, 2]) == 2
assert median([4, 1, 3, 2]) == 2.5
assert percentile([15, 20, 35, 40, 50], 30) == 20
assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
print("all tests passed")
