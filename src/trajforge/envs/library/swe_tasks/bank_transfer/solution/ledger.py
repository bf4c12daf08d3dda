class InsufficientFunds(Exception):
    """The account holds less than asked for."""


class Bank:
    def __init__(self) -> None:
        self._balances: dict[str, int] = {}

    def open(self, name: str, balance: int = 0) -> None:
        if name in self._balances:
            raise ValueError(f"account {name} exists")
        self._balances[name] = balance

    def balance(self, name: str) -> int:
        return self._balances[name]

    def deposit(self, name: str, amount: int) -> None:
        if amount <= 0:
            raise ValueError("amount must be positive")
        self._balances[name] += amount

    def withdraw(self, name: str, amount: int) -> None:
        if amount <= 0:
            raise ValueError("amount must be positive")
        if self._balances[name] < amount:
            raise InsufficientFunds(name)
        self._balances[name] -= amount

    def transfer(self, src: str, dst: str, amount: int) -> None:
        if dst not in self._balances:
            raise KeyError(dst)
        self.withdraw(src, amount)
        self._balances[dst] += amount
