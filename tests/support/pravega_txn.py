"""One transaction with the real Pravega client, in a process of its own
(its blocking calls hold the GIL):
``python -m tests.support.pravega_txn URI SCOPE STREAM EVENTS``.

Writes ``EVENTS`` events ``t:<n>`` (routing key ``t``) in a transaction and
prints ``{"written": txn_id}``; then commits it and prints
``{"committed": true}`` (or ``{"error": ...}``)."""

from __future__ import annotations

import json
import sys

import pravega_client


def main(uri: str, scope: str, stream: str, events: int) -> None:
    manager = pravega_client.StreamManager(uri)
    writer = manager.create_transaction_writer(scope, stream, 11)
    txn = writer.begin_txn()
    for n in range(events):
        txn.write_event(f"t:{n}", routing_key="t")
    print(json.dumps({"written": txn.get_txn_id()}), flush=True)
    try:
        txn.commit()
    except Exception as e:  # reported to the test, which decides
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    print(json.dumps({"committed": True}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
