"""A small fault-injecting HTTP/1.1 proxy for tests, between an S3 client and a server.

:class:`FaultProxy` listens on a loopback port and forwards each request
of each client connection to the upstream server (one upstream connection
per client connection, kept alive), request by request, so every request
meets the fault in force when it arrives (:attr:`FaultProxy.mode`):

* ``"pass"``: forwarded as it is;
* ``"error"``: answered ``503 Slow Down`` with S3's XML error body (what S3
  answers when overloaded), never forwarded;
* ``"slow"``: forwarded after :attr:`FaultProxy.delay_s` seconds (past the
  client's timeout: a hung server).

It understands what the S3 driver sends: a head and a body of
``Content-Length`` bytes (``Expect: 100-continue`` is answered at once),
and answers with a ``Content-Length`` body, none for ``HEAD``, 204 and 304,
or a chunked one.  It runs on its own event loop in a thread, so a test's
loop and a process under test alike can be its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

_ERROR_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
               b"<Message>Please reduce your request rate (injected).</Message></Error>")


class FaultProxy:
    """See the module docstring: ``start()``, :attr:`endpoint_url`, ``stop()``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = "pass"
        self.delay_s = 5.0
        self.requests = 0
        self.faulted = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="fault-proxy")
        self._server: asyncio.Server | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                request = await _read_request(reader, writer)
                if request is None:
                    return
                method, head, body = request
                self.requests += 1
                mode = self.mode
                if mode == "error":
                    self.faulted += 1
                    writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(_ERROR_BODY) + _ERROR_BODY)
                    await writer.drain()
                    continue
                if mode == "slow":
                    self.faulted += 1
                    await asyncio.sleep(self.delay_s)  # the injected slowness
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream)
                up_reader, up_writer = upstream
                up_writer.write(head + body)
                await up_writer.drain()
                writer.write(await _read_response(up_reader, method))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # (cancelled: the proxy stops)
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            if upstream is not None:
                with contextlib.suppress(Exception):
                    upstream[1].close()


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in
            (line.partition(":") for line in lines if line)}


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                        ) -> tuple[str, bytes, bytes] | None:
    """``(method, head without Expect, body)`` of the next request, or None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    method = head.split(b" ", 1)[0].decode()
    headers = _headers(head[:-4])
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        head = b"\r\n".join(line for line in head[:-4].split(b"\r\n")
                            if not line.lower().startswith(b"expect:")) + b"\r\n\r\n"
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, head, body


async def _read_response(reader: asyncio.StreamReader, method: str) -> bytes:
    """The next response's bytes, head and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = _headers(head[:-4])
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return head
    if "content-length" in headers:
        return head + await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            body += size_line + chunk
            if size == 0:
                return head + body
    return head + await reader.read()
