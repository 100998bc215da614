"""Pravega's WireCommands (the segment store's TCP protocol), sans-IO.

Bytes in, commands out: nothing here touches a socket or an event loop.  The
layout is the one the Pravega client 0.3.x speaks (wire version
:data:`WIRE_VERSION` 15, oldest compatible :data:`OLDEST_COMPATIBLE_VERSION`
5); Quire's segment server (:mod:`quire.segmentserver`) and its tests share
this codec.

Frame
-----
::

    | i32 type | i32 length | payload (length bytes) |

Both big-endian.  ``length`` is checked against ``max_frame_bytes`` (default
:data:`MAX_WIRECOMMAND_SIZE`, 0x00FFFFFF, the client's own limit) as soon as
the 8-byte header has arrived, before any of the payload is buffered; a
negative length, an unknown type or a payload that does not parse exactly
(bytes left over count too) is a :class:`~quire.errors.WireCommandError`.

Payload fields
--------------
In declaration order, no padding, big-endian (the client's bincode config)::

    i32, i64     signed, 4 / 8 bytes          u8    1 byte
    u128         16 bytes, unsigned           bool  1 byte, 0 or 1 (else malformed)
    str          u16 byte count | UTF-8       bytes u32 byte count | bytes
    i64 list     u32 count | i64 ...
    TableKey     i32 payload | bytes data | i64 key_version
                 (payload = 4 + len(data) + 8 as the client computes it;
                 read and not checked)
    TableValue   i32 payload | bytes data     (payload = len(data) + 4)
    keys         u32 count | TableKey ...
    entries      u32 count | (TableKey TableValue) ...

Commands (type code: fields; R = a request the server takes, A = an answer)::

    R/A Hello               -127: high_version i32, low_version i32
    R/A KeepAlive            100: (none)
    R SetupAppend              1: request_id i64, writer_id u128, segment str, token str
    R AppendBlockEnd           4: writer_id u128, size_of_whole_events i32, data bytes,
                                  num_event i32, last_event_number i64, request_id i64
    R ReadSegment              9: segment str, offset i64, suggested_length i32, token str,
                                  request_id i64
    R GetStreamSegmentInfo    11: request_id i64, segment str, token str
    R CreateSegment           20: request_id i64, segment str, target_rate i32,
                                  scale_type u8, token str
    R UpdateSegmentPolicy     32: request_id i64, segment str, target_rate i32,
                                  scale_type u8, token str
    R SealSegment             28: request_id i64, segment str, token str
    R DeleteSegment           30: request_id i64, segment str, token str
    R GetSegmentAttribute     34: request_id i64, segment str, attribute_id u128, token str
    R UpdateSegmentAttribute  36: request_id i64, segment str, attribute_id u128,
                                  new_value i64, expected_value i64, token str
    R TruncateSegment         38: request_id i64, segment str, truncation_offset i64, token str
    R CreateTransientSegment  40: request_id i64, writer_id u128, segment str, token str
    R MergeSegments           58: request_id i64, target str, source str, token str
    R CreateTableSegment      70: request_id i64, segment str, token str
    R DeleteTableSegment      71: request_id i64, segment str, must_be_empty bool, token str
    R MergeTableSegments      72: request_id i64, target str, source str, token str
    R SealTableSegment        73: request_id i64, segment str, token str
    R UpdateTableEntries      74: request_id i64, segment str, token str, entries,
                                  table_segment_offset i64
    R RemoveTableKeys         76: request_id i64, segment str, token str, keys,
                                  table_segment_offset i64
    R ReadTable               78: request_id i64, segment str, token str, keys
    R ReadTableKeys           83: request_id i64, segment str, token str,
                                  suggested_key_count i32, continuation_token bytes
    R ReadTableEntries        85: request_id i64, segment str, token str,
                                  suggested_entry_count i32, continuation_token bytes
    R ReadTableEntriesDelta   88: request_id i64, segment str, token str,
                                  from_position i64, suggested_entry_count i32
    R ConditionalBlockEnd     89: writer_id u128, event_number i64, expected_offset i64,
                                  data bytes, request_id i64
    A AppendSetup              2: request_id i64, segment str, writer_id u128,
                                  last_event_number i64
    A DataAppended             7: writer_id u128, event_number i64,
                                  previous_event_number i64, request_id i64,
                                  current_segment_write_offset i64
    A ConditionalCheckFailed   8: writer_id u128, event_number i64, request_id i64
    A SegmentRead             10: segment str, offset i64, at_tail bool, end_of_segment bool,
                                  data bytes, request_id i64
    A StreamSegmentInfo       12: request_id i64, segment_name str, exists bool,
                                  is_sealed bool, is_deleted bool, last_modified i64,
                                  write_offset i64, start_offset i64
    A SegmentCreated          21: request_id i64, segment str
    A SegmentSealed           29: request_id i64, segment str
    A SegmentDeleted          31: request_id i64, segment str
    A SegmentPolicyUpdated    33: request_id i64, segment str
    A SegmentAttribute        35: request_id i64, value i64
    A SegmentAttributeUpdated 37: request_id i64, success bool
    A SegmentTruncated        39: request_id i64, segment str
    A WrongHost               50: request_id i64, segment str, correct_host str,
                                  server_stack_trace str
    A SegmentIsSealed         51: request_id i64, segment str, server_stack_trace str,
                                  offset i64
    A SegmentAlreadyExists    52: request_id i64, segment str, server_stack_trace str
    A NoSuchSegment           53: request_id i64, segment str, server_stack_trace str,
                                  offset i64
    A InvalidEventNumber      55: writer_id u128, event_number i64, server_stack_trace str
    A SegmentIsTruncated      56: request_id i64, segment str, start_offset i64,
                                  server_stack_trace str, offset i64
    A OperationUnsupported    57: request_id i64, operation_name str, server_stack_trace str
    A SegmentsMerged          59: request_id i64, target str, source str,
                                  new_target_write_offset i64
    A AuthTokenCheckFailed    60: request_id i64, server_stack_trace str, error_code i32
    A ErrorMessage            61: request_id i64, segment str, message str, error_code i32
    A TableEntriesUpdated     75: request_id i64, updated_versions i64 list
    A TableKeysRemoved        77: request_id i64, segment str
    A TableRead               79: request_id i64, segment str, entries
    A TableSegmentNotEmpty    80: request_id i64, segment str, server_stack_trace str
    A TableKeyDoesNotExist    81: request_id i64, segment str, server_stack_trace str
    A TableKeyBadVersion      82: request_id i64, segment str, server_stack_trace str
    A TableKeysRead           84: request_id i64, segment str, keys, continuation_token bytes
    A TableEntriesRead        86: request_id i64, segment str, entries,
                                  continuation_token bytes
    A TableEntriesDeltaRead   87: request_id i64, segment str, entries, should_clear bool,
                                  reached_end bool, last_position i64

Quire's own commands (no Pravega client sends them; type codes from 1001)::

    R ReadAppendTimes       1001: request_id i64, segment str, start i64, end i64, token str
    A AppendTimesRead       1002: request_id i64, segment str, storage_length i64,
                                  offsets i64 list, times i64 list
    R LocateAppendTime      1003: request_id i64, segment str, time_ms i64, token str
    A AppendTimeLocated     1004: request_id i64, segment str, offset i64

When each byte was appended (the segment store stamps every append with
its clock, in ms): ``AppendTimesRead`` says bytes from ``offsets[i]`` up to
the next offset were appended at ``times[i]`` (-1: not known), the first
offset being ``start``; ``AppendTimeLocated`` gives the start of the first
append at or after ``time_ms`` (the segment's length if none).  Pravega's
``SegmentRead`` carries no time.

Events inside a segment (and inside an AppendBlockEnd's ``data``) are
``i32 type 0 | i32 length | bytes`` each (:data:`EVENT_HEADER`,
:data:`EVENT_TYPE`); the server stores ``data`` verbatim.

Not decoded (the Rust client never sends them; an unknown type is
malformed): AppendBlock 3, Padding -1, PartialEvent -2, Event 0 as a frame,
ConditionalAppend 5, and the admin commands (FlushToStorage, chunk listing,
batch merges).

Table key versions on the wire: :data:`KEY_NO_VERSION` (``i64`` minimum)
is unconditional, :data:`KEY_NOT_EXISTS` (-1) means "must not exist", any
other value must equal the key's current version.
"""

from quire.pravega_wire.codec import (
    EVENT_HEADER,
    EVENT_TYPE,
    KEY_NO_VERSION,
    KEY_NOT_EXISTS,
    MAX_WIRECOMMAND_SIZE,
    NO_APPEND_TIME,
    NO_EVENT_NUMBER,
    OLDEST_COMPATIBLE_VERSION,
    REPLY_TYPES,
    REQUEST_TYPES,
    WIRE_VERSION,
    AppendBlockEnd,
    AppendSetup,
    AppendTimeLocated,
    AppendTimesRead,
    AuthTokenCheckFailed,
    ConditionalBlockEnd,
    ConditionalCheckFailed,
    CreateSegment,
    CreateTableSegment,
    CreateTransientSegment,
    DataAppended,
    Decoder,
    DeleteSegment,
    DeleteTableSegment,
    ErrorMessage,
    GetSegmentAttribute,
    GetStreamSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    LocateAppendTime,
    MergeSegments,
    MergeTableSegments,
    NoSuchSegment,
    OperationUnsupported,
    ReadAppendTimes,
    ReadSegment,
    ReadTable,
    ReadTableEntries,
    ReadTableEntriesDelta,
    ReadTableKeys,
    RemoveTableKeys,
    SealSegment,
    SealTableSegment,
    SegmentAlreadyExists,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentPolicyUpdated,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    StreamSegmentInfo,
    TableEntriesDeltaRead,
    TableEntriesRead,
    TableEntriesUpdated,
    TableKey,
    TableKeyBadVersion,
    TableKeyDoesNotExist,
    TableKeysRead,
    TableKeysRemoved,
    TableRead,
    TableSegmentNotEmpty,
    TableValue,
    TruncateSegment,
    UpdateSegmentAttribute,
    UpdateSegmentPolicy,
    UpdateTableEntries,
    WireCommand,
    WrongHost,
)

__all__ = [
    "EVENT_HEADER", "EVENT_TYPE", "KEY_NOT_EXISTS", "KEY_NO_VERSION", "MAX_WIRECOMMAND_SIZE",
    "NO_APPEND_TIME", "NO_EVENT_NUMBER", "OLDEST_COMPATIBLE_VERSION", "REPLY_TYPES",
    "REQUEST_TYPES", "WIRE_VERSION", "AppendBlockEnd", "AppendSetup", "AppendTimeLocated",
    "AppendTimesRead", "AuthTokenCheckFailed", "ConditionalBlockEnd",
    "ConditionalCheckFailed", "CreateSegment", "CreateTableSegment", "CreateTransientSegment",
    "DataAppended", "Decoder", "DeleteSegment", "DeleteTableSegment", "ErrorMessage",
    "GetSegmentAttribute", "GetStreamSegmentInfo", "Hello", "InvalidEventNumber", "KeepAlive",
    "LocateAppendTime", "MergeSegments", "MergeTableSegments", "NoSuchSegment",
    "OperationUnsupported", "ReadAppendTimes", "ReadSegment", "ReadTable", "ReadTableEntries",
    "ReadTableEntriesDelta", "ReadTableKeys",
    "RemoveTableKeys", "SealSegment", "SealTableSegment", "SegmentAlreadyExists",
    "SegmentAttribute", "SegmentAttributeUpdated", "SegmentCreated", "SegmentDeleted",
    "SegmentIsSealed", "SegmentIsTruncated", "SegmentPolicyUpdated", "SegmentRead",
    "SegmentSealed", "SegmentTruncated", "SegmentsMerged", "SetupAppend", "StreamSegmentInfo",
    "TableEntriesDeltaRead", "TableEntriesRead", "TableEntriesUpdated", "TableKey",
    "TableKeyBadVersion", "TableKeyDoesNotExist", "TableKeysRead", "TableKeysRemoved",
    "TableRead", "TableSegmentNotEmpty", "TableValue", "TruncateSegment",
    "UpdateSegmentAttribute", "UpdateSegmentPolicy", "UpdateTableEntries", "WireCommand",
    "WrongHost",
]
