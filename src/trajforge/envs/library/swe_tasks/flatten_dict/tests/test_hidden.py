import nested


def test_flatten():
    flat = nested.flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": 3})
    assert flat == {"a.b": 1, "a.c.d": [1, 2], "e": 3}
    assert nested.flatten({"a": {}}) == {"a": {}}
    assert nested.flatten({"a": {"b": 1}}, sep="/") == {"a/b": 1}


def test_unflatten():
    assert nested.unflatten({"a.b": 1, "a.c": 2, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}
    tree = {"x": {"y": {"z": 1}}, "w": [1]}
    assert nested.unflatten(nested.flatten(tree)) == tree


def test_unflatten_conflict():
    for bad in ({"a": 1, "a.b": 2}, {"a.b": 2, "a": 1}):
        try:
            nested.unflatten(bad)
        except ValueError:
            continue
        raise AssertionError(f"no conflict reported for {bad}")


def test_get_path():
    assert nested.get_path({"a": {"b": 2}}, "a.b") == 2
