"""A writer process using the real Pravega client, for tests that must not
share a process with its blocking calls (they hold the GIL while they wait).

``python -m tests.support.pravega_writer CONTROLLER_URI SCOPE STREAM KEYS EVENTS_PER_KEY``
writes ``key<k>:<n>`` with routing key ``key<k>`` for n in range(EVENTS_PER_KEY),
k in range(KEYS), each acknowledged before the next; prints a JSON line
``{"written": count}`` every ``KEYS`` events, then ``{"done": count}`` (or
``{"error": "..."}``)."""

from __future__ import annotations

import json
import sys

import pravega_client


def main() -> None:
    uri, scope, stream, keys, per_key = sys.argv[1:6]
    manager = pravega_client.StreamManager(uri)  # kept: the writer runs on its runtime
    writer = manager.create_writer(scope, stream)
    written = 0
    try:
        for n in range(int(per_key)):
            for k in range(int(keys)):
                writer.write_event(f"key{k}:{n}", routing_key=f"key{k}")
                written += 1
            print(json.dumps({"written": written}), flush=True)
        writer.flush()
    except Exception as e:  # reported to the test, which fails on it
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "written": written}),
              flush=True)
        return
    print(json.dumps({"done": written}), flush=True)


if __name__ == "__main__":
    main()
