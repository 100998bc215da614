"""Ledger recovery: fence the ledger, find its end, close it (BookKeeper's
LedgerRecoveryOp with ReadLastConfirmedOp's fencing, under Quire's rules).

1. Metadata goes OPEN -> IN_RECOVERY by compare-and-set (a ledger already
   IN_RECOVERY is recovered again: a recoverer may have died).
2. **Fence**: a fencing READ_ENTRY(-1) goes to every bookie of the last
   fragment.  Fenced bookies refuse the old writer's adds.  Recovery goes on
   once ``E - A + 1`` of them answered OK or a definite no (then fewer than
   ``A`` bookies are unfenced, so no write set can gather an ack quorum);
   ``A`` unknown answers mean that can no longer happen: LedgerRecoveryError.
3. Start after ``max(highest LAC in the answers, last fragment start - 1)``.
4. **Recovery reads**, entry by entry, every replica of the write set at
   once: one copy whose digest verifies makes the entry recoverable; it is
   *gone* only when ``W - A + 1`` replicas say NO_SUCH_ENTRY/NO_SUCH_LEDGER
   (then it cannot have been acknowledged).  Anything else (errors,
   timeouts, UNKNOWN, bad digests: never a no) is LedgerRecoveryError.  The
   first gone entry ends the ledger.
5. Recovered entries are written back verbatim (RECOVERY_ADD, accepted by
   fenced bookies; ensemble changes allowed), then metadata becomes CLOSED at
   the last recovered entry.  A recoverer that loses the final
   compare-and-set to a close adopts that close: concurrent recoveries agree.
"""

from __future__ import annotations

import asyncio
import logging

from quire.client.context import ClientContext
from quire.client.passwords import Password, keys_for
from quire.client.placement import write_set_bookies
from quire.client.reads import EntryReadOp
from quire.client.write_handle import WriteHandle
from quire.errors import (
    EXPLICIT_NEGATIVES,
    DigestMismatchError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataError,
    MetadataNotFoundError,
    QuireError,
    UnauthorizedError,
)
from quire.metadata import LedgerMetadata, Versioned
from quire.protocol import DigestManager, LedgerKeys, ReadResponse
from quire.types import NO_ENTRY, LedgerState

log = logging.getLogger("quire.client")


async def recover_ledger(ctx: ClientContext, ledger_id: int,
                         password: Password | None) -> Versioned[LedgerMetadata]:
    """Fence and close the ledger; return its CLOSED metadata (at once if it
    is closed already).  UnauthorizedError for a wrong password (None: the
    keys the metadata holds, :meth:`Client.open_ledger_as_admin`),
    LedgerRecoveryError when its end cannot be decided now (retry later)."""
    store = ctx.store
    lost_race: QuireError | None = None
    for _attempt in range(ctx.config.recovery_max_attempts):
        versioned = await store.read_ledger(ledger_id)
        md = versioned.value
        keys = md.keys if password is None else keys_for(ledger_id, md, password)
        if md.state is LedgerState.CLOSED:
            return versioned
        if md.state is LedgerState.OPEN:
            try:
                versioned = await store.write_ledger(
                    ledger_id, md.with_(state=LedgerState.IN_RECOVERY), versioned.version)
            except MetadataNotFoundError:
                raise
            except MetadataError as e:  # lost a race, or outcome unknown: look again
                lost_race = e
                continue
        try:
            return await LedgerRecoveryOp(ctx, ledger_id, versioned, keys).run()
        except LedgerFencedError as e:  # another client changed the metadata meanwhile
            log.info("ledger %d: recovery lost a metadata race (%s); starting over",
                     ledger_id, e)
            lost_race = e
    raise LedgerRecoveryError(
        f"ledger {ledger_id}: recovery gave up after {ctx.config.recovery_max_attempts} "
        f"attempts; its metadata kept changing ({lost_race})")


class LedgerRecoveryOp:
    """One recovery attempt of a ledger whose metadata is IN_RECOVERY."""

    def __init__(self, ctx: ClientContext, ledger_id: int,
                 versioned: Versioned[LedgerMetadata], keys: LedgerKeys) -> None:
        md = versioned.value
        self._ctx = ctx
        self._ledger_id = ledger_id
        self._versioned = versioned
        self._keys = keys
        self._digest = DigestManager.of_keys(ledger_id, md.digest_type, keys)
        self._master_key = keys.master_key
        self._metadata = md

    async def run(self) -> Versioned[LedgerMetadata]:
        md = self._metadata
        last_first, ensemble = md.ensembles[-1]
        fenced_lac, lengths = await self._fence(ensemble)
        start = max(fenced_lac, last_first - 1) + 1
        length = await self._length_at(start - 1, lengths)
        log.info("ledger %d: fenced; recovering from entry %d", self._ledger_id, start)
        writer = WriteHandle(self._ctx, self._ledger_id, self._versioned, self._keys,
                             recovery=True, last_add_confirmed=start - 1, length=length)
        try:
            await self._recover_entries(writer, start, ensemble)
            await writer._drain()
        except BaseException as e:
            writer._shutdown(e if isinstance(e, QuireError) else None)
            raise
        error = writer._error
        if isinstance(error, LedgerFencedError):
            raise error
        if error is not None:
            raise LedgerRecoveryError(
                f"ledger {self._ledger_id}: writing recovered entries back failed: {error}"
            ) from error
        last, length = writer.last_add_confirmed, writer._lac_length
        closed = await writer._update_metadata(writer._closing_change(last, length),
                                               adopt=lambda md: md.state is LedgerState.CLOSED)
        final = closed.value
        if final.last_entry_id == last:
            log.info("ledger %d: recovered and closed at entry %d", self._ledger_id, last)
        else:
            log.info("ledger %d: another recoverer closed it at entry %d first (this one "
                     "found %d)", self._ledger_id, final.last_entry_id, last)
        return closed

    async def _fence(self, ensemble: tuple[str, ...]) -> tuple[int, dict[int, int]]:
        """Fence the bookies of the last fragment.  Returns the highest LAC
        their answers carry and ``{entry id: length}`` of the entries seen."""
        md = self._metadata
        needed = len(ensemble) - md.ack_quorum_size + 1
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        fenced: list[str] = []
        unknown: list[str] = []
        lac = NO_ENTRY
        lengths: dict[int, int] = {}

        def on_answer(bookie: str, result: ReadResponse | QuireError) -> None:
            nonlocal lac
            if done.done():
                return
            if isinstance(result, ReadResponse):
                fenced.append(bookie)
                assert result.entry is not None
                try:
                    header, _ = self._digest.verify(result.entry)
                except DigestMismatchError:
                    pass  # fenced all the same; its LAC is just not usable
                else:
                    lac = max(lac, header.lac)
                    lengths[header.entry_id] = header.length
            elif isinstance(result, EXPLICIT_NEGATIVES):
                fenced.append(bookie)
            elif isinstance(result, UnauthorizedError):
                done.set_exception(UnauthorizedError(
                    f"bookie {bookie} refused the master key of ledger {self._ledger_id}"))
                return
            else:
                unknown.append(str(result))
            if len(fenced) >= needed:
                done.set_result(None)
            elif len(unknown) >= md.ack_quorum_size:
                done.set_exception(LedgerRecoveryError(
                    f"ledger {self._ledger_id}: cannot fence {needed} of {len(ensemble)} "
                    f"bookies ({'; '.join(unknown)})"))

        for bookie in ensemble:
            self._ctx.pool.client(bookie).fence_read(self._ledger_id, self._master_key,
                                                     self._ctx.read_timeout_s, on_answer, bookie)
        await done
        return lac, lengths

    async def _length_at(self, entry_id: int, lengths: dict[int, int]) -> int:
        """The ledger length up to and including ``entry_id`` (a confirmed entry)."""
        if entry_id < 0:
            return 0
        if entry_id in lengths:
            return lengths[entry_id]
        md = self._metadata
        replicas = self._ctx.pool.order_for_reads(
            write_set_bookies(md.ensemble_at(entry_id), entry_id, md.write_quorum_size))
        future: asyncio.Future[EntryReadOp] = asyncio.get_running_loop().create_future()
        EntryReadOp(self._ctx, self._digest, entry_id, replicas, future.set_result).start()
        op = await future
        if op.header is None:
            raise LedgerRecoveryError(
                f"ledger {self._ledger_id}: cannot read entry {entry_id}, the last confirmed "
                f"one, to learn the ledger's length: {op.error}")
        return op.header.length

    async def _recover_entries(self, writer: WriteHandle, start: int,
                               ensemble: tuple[str, ...]) -> None:
        """Read entries from ``start`` (``recovery_batch_size`` ahead) and push
        each recoverable one to ``writer``, up to the first gone entry."""
        md = self._metadata
        gone_threshold = md.write_quorum_size - md.ack_quorum_size + 1
        loop = asyncio.get_running_loop()
        reads: dict[int, asyncio.Future[EntryReadOp]] = {}
        next_read = start

        def launch() -> None:
            nonlocal next_read
            entry_id = next_read
            next_read += 1
            future: asyncio.Future[EntryReadOp] = loop.create_future()
            reads[entry_id] = future
            replicas = write_set_bookies(ensemble, entry_id, md.write_quorum_size)
            EntryReadOp(self._ctx, self._digest, entry_id, replicas, future.set_result,
                        recovery=True, gone_threshold=gone_threshold).start()

        for _ in range(self._ctx.config.recovery_batch_size):
            launch()
        entry_id = start
        while True:
            op = await reads.pop(entry_id)
            if op.gone:
                return
            if op.stored is None or op.header is None:
                raise LedgerRecoveryError(
                    f"ledger {self._ledger_id}: cannot tell whether entry {entry_id} exists: "
                    f"{op.error}")
            if writer._queued:
                await writer._drain()  # writes lag behind reads: let them catch up
            if writer._error is not None:
                return  # the caller reports it
            writer._push_recovered(entry_id, op.stored, op.header.length)
            launch()
            entry_id += 1
