"""Names and sizes from requests are matched whole: a ``$`` that also matches before a trailing
newline let ``"1024x1024\\n"`` through (the class of issue 24's run id ``"run-1\\n"``)."""

from __future__ import annotations

import pytest

from trajforge.testing.images import validate_generation
from trajforge.tools._args import ArgumentError
from trajforge.tools.browser import _ref


@pytest.mark.parametrize("size", ["1024x1024\n", "1024x1024\nauto", "auto\n", "12x12x12"])
def test_image_sizes_are_matched_whole(size: str) -> None:
    assert validate_generation({"prompt": "a cat", "size": size}) is not None


@pytest.mark.parametrize("size", ["1024x1024", "auto", "64x64"])
def test_good_image_sizes_pass(size: str) -> None:
    assert validate_generation({"prompt": "a cat", "size": size}) is None


@pytest.mark.parametrize("ref", ["e12\nx", "e12x", "f1e2e3", "x"])
def test_browser_refs_are_matched_whole(ref: str) -> None:
    with pytest.raises(ArgumentError):
        _ref({"ref": ref})


def test_browser_refs_accept_snapshot_forms() -> None:
    assert _ref({"ref": "[ref=e12]"}) == "e12"
    assert _ref({"ref": "f3e7"}) == "f3e7"
