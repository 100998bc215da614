"""Asking a Quire process's HTTP server for JSON (the operator's tools' side).

:func:`request_json` is how ``quire`` commands talk to a running process's
:mod:`quire.http` server (``quire bookie gc --now``, ``quire segmentstore
status``): a blocking request (a command line has nothing else to do
meanwhile) over HTTPS with a CA's context, with an ``Authorization``
header if given, answered by a JSON object.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from quire.errors import AdminRequestError


def request_json(method: str, address: str, path: str, *, timeout_s: float,
                 tls: ssl.SSLContext | None = None, authorization: str | None = None,
                 body: bytes | None = None) -> dict[str, Any]:
    """``method path`` at ``address`` (``host:port``; HTTPS with ``tls``) and
    its JSON object answer; :class:`~quire.errors.AdminRequestError` if it
    cannot be asked, answers an error status (its ``error`` says why) or
    something that is not a JSON object."""
    url = f"{'https' if tls is not None else 'http'}://{address}{path}"
    headers = {"Authorization": authorization} if authorization else {}
    if body is None and method == "POST":
        body = b""
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=tls) as answer:
            found = json.loads(answer.read())
    except urllib.error.HTTPError as e:
        try:
            reason = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            reason = e.reason
        raise AdminRequestError(f"{url}: {reason}") from None
    except (OSError, ValueError) as e:
        raise AdminRequestError(f"{url}: {e}") from None
    if not isinstance(found, dict):
        raise AdminRequestError(f"{url}: the answer is not a JSON object")
    return found
