"""Watch the page-cache advice the storage engine gives."""

from __future__ import annotations

import os

import pytest


def record_dontneed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record ``(offset, length)`` of every ``posix_fadvise`` call (each must
    be POSIX_FADV_DONTNEED) and still pass it on to the kernel."""
    calls: list[tuple[int, int]] = []
    real_fadvise = os.posix_fadvise

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_DONTNEED
        calls.append((offset, length))
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return calls
