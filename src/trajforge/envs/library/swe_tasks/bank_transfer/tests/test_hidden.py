from ledger import Bank, InsufficientFunds


def _bank():
    b = Bank()
    b.open("alice", 100)
    b.open("bob", 5)
    return b


def test_transfer_moves_money():
    b = _bank()
    b.transfer("alice", "bob", 30)
    assert (b.balance("alice"), b.balance("bob")) == (70, 35)


def test_transfer_failures_change_nothing():
    b = _bank()
    for args, exc in [
        (("bob", "alice", 6), InsufficientFunds),
        (("alice", "carol", 1), KeyError),
        (("carol", "alice", 1), KeyError),
        (("alice", "bob", 0), ValueError),
        (("alice", "bob", -5), ValueError),
    ]:
        try:
            b.transfer(*args)
        except exc:
            pass
        else:
            raise AssertionError(f"{args} did not raise {exc.__name__}")
        assert (b.balance("alice"), b.balance("bob")) == (100, 5)


def test_withdraw():
    b = _bank()
    b.withdraw("alice", 40)
    assert b.balance("alice") == 60
