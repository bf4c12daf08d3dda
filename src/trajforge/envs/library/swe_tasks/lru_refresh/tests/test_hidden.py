from cachelib import LRUCache


def test_get_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert "a" in c and "c" in c and "b" not in c


def test_put_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert "b" not in c
    assert c.get("a") == 10


def test_basic():
    c = LRUCache(1)
    c.put("x", 1)
    c.put("y", 2)
    assert len(c) == 1 and c.get("x") is None and c.get("y") == 2
    assert c.get("missing", 7) == 7
