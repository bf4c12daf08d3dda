"""A semaphore whose size can change while it is held (rollout slots, tool slots).

``asyncio.Semaphore`` cannot grow or shrink; evaluating ~90 long terminal tasks must not queue on a
pool sized before anybody knew (the reference's ``resize_tool_pool``). Shrinking never interrupts
holders: the extra slots simply are not handed out again until usage falls under the new size.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class ResizableLimiter:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a limiter needs at least one slot, not {size}")
        self._size = size
        self._used = 0
        self._waiting = 0
        self._cond = asyncio.Condition()

    @property
    def size(self) -> int:
        return self._size

    @property
    def in_use(self) -> int:
        return self._used

    @property
    def waiting(self) -> int:
        return self._waiting

    async def resize(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a limiter needs at least one slot, not {size}")
        async with self._cond:
            self._size = size
            self._cond.notify_all()

    async def acquire(self) -> None:
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: self._used < self._size)
            finally:
                self._waiting -= 1
            self._used += 1

    async def release(self) -> None:
        async with self._cond:
            self._used -= 1
            self._cond.notify()

    async def __aenter__(self) -> ResizableLimiter:
        await self.acquire()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()

    def report(self) -> dict[str, int]:
        return {"size": self._size, "in_use": self._used, "waiting": self._waiting}
