"""``trajforge.cleanup.finish``: a cleanup runs to its end whatever cancellations its task gets."""

from __future__ import annotations

import asyncio
import logging

import pytest

from trajforge.cleanup import finish


async def _slow_cleanup(done: list[str], steps: int = 5, fail: bool = False) -> str:
    for i in range(steps):
        await asyncio.sleep(0.01)
        done.append(f"step {i}")
    if fail:
        raise OSError("the cleanup could not remove its directory")
    return "cleaned"


async def test_without_a_cancellation_it_is_the_cleanup() -> None:
    done: list[str] = []
    assert await finish(_slow_cleanup(done)) == "cleaned"
    assert len(done) == 5
    with pytest.raises(OSError, match="could not remove"):
        await finish(_slow_cleanup([], fail=True))


@pytest.mark.parametrize("cancels", [1, 3])
async def test_a_cancelled_task_finishes_its_cleanup_then_is_cancelled(cancels: int) -> None:
    done: list[str] = []
    task = asyncio.ensure_future(finish(_slow_cleanup(done)))
    for _ in range(cancels):
        await asyncio.sleep(0.015)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == [f"step {i}" for i in range(5)]  # every step ran, after every cancel
    assert task.cancelled()


async def test_a_timeout_waits_for_the_cleanup_and_is_still_a_timeout() -> None:
    done: list[str] = []
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.015):
            await finish(_slow_cleanup(done))
    assert len(done) == 5


async def test_a_cleanup_that_fails_after_a_cancel_is_logged_and_the_cancel_wins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = asyncio.ensure_future(finish(_slow_cleanup([], fail=True)))
    await asyncio.sleep(0.015)
    task.cancel()
    with caplog.at_level(logging.WARNING, logger="trajforge.cleanup"), pytest.raises(asyncio.CancelledError):
        await task
    assert "could not remove its directory" in caplog.text


async def test_a_cancel_in_the_turn_the_cleanup_ends_is_not_lost() -> None:
    """The cleanup's last step and the cancel in one turn of the loop: still cancelled."""
    for delay in (0.0, 0.0001, 0.0005):
        release = asyncio.Event()

        async def cleanup(release: asyncio.Event = release) -> str:
            await release.wait()
            return "cleaned"

        task = asyncio.ensure_future(finish(cleanup()))
        await asyncio.sleep(delay)
        release.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
