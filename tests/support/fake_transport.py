"""A transport that records what a protocol writes, for bookie connection tests."""

from __future__ import annotations

from typing import Any


class FakeTransport:
    def __init__(self, peername: tuple[str, int] = ("127.0.0.1", 1)) -> None:
        self.peername = peername
        self.reading = True
        self.write_buffer_size = 0
        self.written: list[bytes] = []
        self.aborted = False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return self.write_buffer_size

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.write_buffer_limits = (high, low)

    def get_extra_info(self, name: str) -> Any:
        return self.peername

    def writelines(self, data: list[bytes]) -> None:
        self.written.append(b"".join(data))
