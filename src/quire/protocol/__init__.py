"""Quire's wire protocol and stored-entry format, sans-IO.

Bytes in, messages out: nothing here touches a socket, a file or an event
loop, so the bookie server, the client and the tests share one codec.
Modelled on BookKeeper's V2 protocol.  All integers are big-endian; ``i64``
is signed, ``u64``/``u32`` unsigned.  The same layout is in
``docs/protocol.md``.

Frame
-----
::

    | u32 frame_len | u32 header | body ...                      |
      frame_len = 4 + len(body)  (bytes after the length itself)
      header    = (version << 24) | (op << 16) | flags           (version = 1)

``frame_len`` is checked against ``max_frame_bytes`` (default 5 MiB) as soon
as its four bytes arrive, before the body is buffered.

Operations (``op``) and request flags::

    ADD_ENTRY 1   READ_ENTRY 2   (3 reserved)   READ_LAC 4   WRITE_LAC 5
    GET_BOOKIE_INFO 6   BATCH_READ_ENTRY 7 (BP-62)   SYNC 8 (BP-14)

    DO_FENCING 0x0001           read/batch read fences the ledger (carries the master key)
    RECOVERY_ADD 0x0002         add written by recovery: accepted on fenced ledgers
    VOLATILE_DURABILITY 0x0004  BP-14 durability level VD (ack before fsync); unset = PD
    BARE_ERROR 0x8000           response flag: body is only request_id + status

Request bodies (every request but BATCH_READ_ENTRY starts with its
request id, and every future op must, so that a bookie that does not know an
op can still answer UNSUPPORTED to the right request)::

    ADD_ENTRY        u64 request_id | 20 master_key | entry (stored entry, below)
    READ_ENTRY       u64 request_id | i64 ledger_id | i64 entry_id
                     [| 20 master_key  if DO_FENCING]     entry_id -1 = last entry
    READ_LAC         u64 request_id | i64 ledger_id
    WRITE_LAC        u64 request_id | i64 ledger_id | i64 lac | 20 master_key
    GET_BOOKIE_INFO  u64 request_id
    BATCH_READ_ENTRY i64 ledger_id | i64 start_entry_id | u64 request_id
                     | i32 max_count | i64 max_size [| 20 master_key  if DO_FENCING]
    SYNC             u64 request_id | i64 ledger_id

Response bodies (the header repeats the request's op; flags 0)::

    ADD_ENTRY        u64 request_id | i32 status | i64 ledger_id | i64 entry_id
                     | i64 last_add_synced                       (BP-14; -1 = none)
    READ_ENTRY       u64 request_id | i32 status | i64 ledger_id | i64 entry_id
                     [| entry  if status == OK]
    READ_LAC         u64 request_id | i32 status | i64 ledger_id | i64 lac
    WRITE_LAC        u64 request_id | i32 status | i64 ledger_id
    GET_BOOKIE_INFO  u64 request_id | i32 status | i64 free_bytes | i64 total_bytes
    BATCH_READ_ENTRY i32 status | i64 ledger_id | i64 start_entry_id | u64 request_id
                     | (u32 entry_len | entry) *                 (BP-62 order)
    SYNC             u64 request_id | i32 status | i64 ledger_id | i64 last_add_synced
    any op, BARE_ERROR flag: u64 request_id | i32 status

Deviation from BP-62's diagram: our frame has one length prefix, so the
request's ``header_size`` and the response's ``response_size`` words are not
sent; everything after them is byte for byte as the BP draws it.

Stored entry (written by the client, kept verbatim by bookies)::

    i64 ledger_id | i64 entry_id | i64 lac | i64 length | digest | payload
      length = total payload bytes of entries 0..entry_id
      digest over the 32-byte header + payload; by digest type:
        CRC32C 4 bytes (u32), CRC32 8 bytes (u64, as BookKeeper), HMAC_SHA1 20, NONE 0

Keys, derived from the ledger password as BookKeeper derives them
(:mod:`quire.security.ledger_keys`, re-exported here):
``master_key = SHA1(b"ledger" + password)`` (sent with adds, fencing and
WRITE_LAC); ``mac_key = SHA1(b"mac" + password)`` (HMAC-SHA1 digests).
"""

from quire.errors import ProtocolError, StatusCode
from quire.protocol.codec import (
    BATCH_READ_RESPONSE_OVERHEAD_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_BARE_ERROR,
    FLAG_DO_FENCING,
    FLAG_RECOVERY_ADD,
    FLAG_VOLATILE_DURABILITY,
    LAST_ENTRY_ID,
    MASTER_KEY_LEN,
    PROTOCOL_VERSION,
    AddRequest,
    AddRequestRun,
    AddResponse,
    BatchReadRequest,
    BatchReadResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    Decoder,
    ErrorResponse,
    Message,
    OpCode,
    RawAddAnswer,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    SyncRequest,
    SyncResponse,
    UnknownRequest,
    WriteLacRequest,
    WriteLacResponse,
    add_response_of,
    batch_read_room,
    encode_add_request,
    encode_batch_read_records,
)
from quire.protocol.entry import (
    ENTRY_HEADER_LEN,
    DigestManager,
    EntryHeader,
    peek_entry_ids,
)
from quire.security.ledger_keys import LedgerKeys, mac_key, master_key

__all__ = [
    "BATCH_READ_RESPONSE_OVERHEAD_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "ENTRY_HEADER_LEN",
    "FLAG_BARE_ERROR",
    "FLAG_DO_FENCING",
    "FLAG_RECOVERY_ADD",
    "FLAG_VOLATILE_DURABILITY",
    "LAST_ENTRY_ID",
    "MASTER_KEY_LEN",
    "PROTOCOL_VERSION",
    "AddRequest",
    "AddRequestRun",
    "AddResponse",
    "BatchReadRequest",
    "BatchReadResponse",
    "BookieInfoRequest",
    "BookieInfoResponse",
    "Decoder",
    "DigestManager",
    "EntryHeader",
    "ErrorResponse",
    "LedgerKeys",
    "Message",
    "OpCode",
    "ProtocolError",
    "RawAddAnswer",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRequest",
    "ReadResponse",
    "Request",
    "Response",
    "StatusCode",
    "SyncRequest",
    "SyncResponse",
    "UnknownRequest",
    "WriteLacRequest",
    "WriteLacResponse",
    "add_response_of",
    "batch_read_room",
    "encode_add_request",
    "encode_batch_read_records",
    "mac_key",
    "master_key",
    "peek_entry_ids",
]
