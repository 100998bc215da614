"""Who owns a segment: resolvers for :class:`~quire.streams.segments.RemoteSegmentStore`.

- :func:`controller_resolver` asks the controller's ``getURI`` (what the
  Pravega client does); names that are not stream segments (tables such as
  ``_system/...``) are asked as segment 0 of their first two path parts,
  which the controller answers like any other.  An unavailable answer (no
  live owner now, or no controller) is ContainerNotOwnedError, retried.
- :func:`metadata_resolver` reads the metadata store directly: the
  cluster's ``container_count`` record (read once) gives the segment's
  container (:func:`~quire.segmentstore.names.container_of`), and an owner
  lookup (``segmentstore.ownership.owner_address``: the assignment record
  and the owner's leased host record) gives its address.  No live owner is
  ContainerNotOwnedError, which the store retries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quire.errors import ContainerNotOwnedError, ControllerUnavailableError
from quire.metadata import MetadataStore
from quire.segmentstore.names import CONTAINER_COUNT_KEY, container_of
from quire.streams.controller import ControllerClient
from quire.streams.model import parse_segment_name
from quire.streams.segments import Resolver

OwnerLookup = Callable[[MetadataStore, int], Awaitable[str | None]]
"""``await owner_address(metadata, container_id)``: the wire address of the
live segment store assigned the container, None while there is none."""


def controller_resolver(controller: ControllerClient) -> Resolver:
    async def resolve(segment: str) -> str:
        parsed = parse_segment_name(segment)
        if parsed is None:
            scope, _, rest = segment.partition("/")
            parsed = scope, rest.partition("/")[0], 0
        try:
            return await controller.segment_uri(*parsed)
        except ControllerUnavailableError as e:
            # no live owner now (a crashed store's containers not yet taken
            # over), or no controller answer: the store retries, as the
            # Resolver contract says, rather than failing the operation
            raise ContainerNotOwnedError(f"no owner of {segment!r} known now: {e}") from e
    return resolve


def metadata_resolver(metadata: MetadataStore, owner_address: OwnerLookup) -> Resolver:
    container_count: list[int] = []

    async def resolve(segment: str) -> str:
        if not container_count:
            container_count.append(int((await metadata.read_record(CONTAINER_COUNT_KEY)).value))
        container = container_of(segment, container_count[0])
        address = await owner_address(metadata, container)
        if address is None:
            raise ContainerNotOwnedError(f"no live segment store owns container {container} "
                                         f"(segment {segment!r}) now")
        return address
    return resolve
