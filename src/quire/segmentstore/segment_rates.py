"""Per-segment rates and auto-scaling's hot and cold reports, as Pravega's
segment store makes them (its ``SegmentAggregates`` and ``AutoScaleProcessor``).

A segment's scaling policy is two of its attributes, set by the controller
when it creates the segment (``CreateSegment``'s scale type and target
rate) and when the stream's policy changes (``UpdateSegmentPolicy``):
:data:`SCALE_POLICY_TYPE_KEY` (0: none, 1: by KiB/s, 2: by events/s) and
:data:`SCALE_POLICY_RATE_KEY`, with Pravega's attribute ids.

Measuring costs the append path two additions: the container adds the
append's bytes and events to the segment's two counters in its accepted
state (``SegmentMetadata.appended_bytes`` and ``appended_events``).  The
events of a writer's append are the step of its event number (Pravega's
writers number events one by one), 1 for an append without a writer.

Every tick (5 s), :class:`AutoScaleMonitor` takes the counters and folds
them into four exponentially weighted rates per segment with a policy,
over windows of 2, 5, 10 and 20 minutes (transaction segments count for
their parent).  Past the cooldown since it first saw the segment:

* **hot** if the 2-minute rate is above 5x the target, the 5-minute one
  above 2x, or the 10-minute one above it (each once the segment has been
  seen that long): a request to split it into ``max(2, rate / target)``;
* **cold** if the 2-, 5- and 10-minute rates are below the target and the
  20-minute one below half of it (once seen 20 minutes): a request to
  merge it with cold neighbours.

A request for a segment is muted for the mute period after the last one
(a split mutes both kinds, a merge only merges).  Windows, cooldown and
mute are :class:`AutoScalerConfig`; :meth:`AutoScalerConfig.every` sets
them all to N seconds for tests and demos.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from quire.errors import ConfigError
from quire.segmentstore.metadata import ContainerMetadata
from quire.segmentstore.names import base_segment_name
from quire.segmentstore.types import SegmentType

_CORE_ATTRIBUTE = 1 << 127
"""Pravega's core attribute ids: UUIDs whose high half is Long.MIN_VALUE."""
SCALE_POLICY_TYPE_KEY = _CORE_ATTRIBUTE | 2
SCALE_POLICY_RATE_KEY = _CORE_ATTRIBUTE | 3
NO_SCALING, BY_KBYTES, BY_EVENTS = 0, 1, 2
"""Scale types, as the wire's ``ScaleType`` and the controller's policy number them."""


def policy_attributes(scale_type: int, target_rate: int) -> dict[int, int]:
    """The attributes that hold a segment's scaling policy."""
    return {SCALE_POLICY_TYPE_KEY: scale_type, SCALE_POLICY_RATE_KEY: target_rate}


@dataclass(frozen=True)
class AutoScalerConfig:
    """Auto-scaling at the segment store (Pravega's defaults)."""

    windows_s: tuple[int, ...] = (120, 300, 600, 1200)
    """The four rate windows (Pravega's 2, 5, 10 and 20 minutes)."""
    cooldown_s: int = 600
    """No request for a segment seen for less than this."""
    mute_s: int = 600
    """No request for a segment this soon after the last."""
    tick_ms: int = 5_000
    """How often the rates are updated and the rules applied."""

    def __post_init__(self) -> None:
        if len(self.windows_s) != 4 or any(w <= 0 for w in self.windows_s):
            raise ConfigError("autoscale windows: four positive numbers of seconds")
        if self.cooldown_s < 0 or self.mute_s < 0 or self.tick_ms <= 0:
            raise ConfigError("autoscale cooldown and mute are not negative, the tick positive")

    @classmethod
    def every(cls, interval_s: int) -> AutoScalerConfig:
        """Windows, cooldown and mute of ``interval_s`` seconds (tests, demos)."""
        return cls((interval_s,) * 4, interval_s, interval_s,
                   max(100, interval_s * 1000 // 5))


@dataclass(frozen=True)
class ScaleRequest:
    """A hot segment to split into ``splits``, or a cold one to merge."""

    scope: str
    stream: str
    segment_id: int
    up: bool
    splits: int
    timestamp_ms: int


class RateAggregates:
    """One segment's exponentially weighted rates (per second; KiB for a
    byte-rate policy) and when it was first seen and last reported."""

    __slots__ = ("last_down_ms", "last_ms", "last_up_ms", "rates", "start_ms")

    def __init__(self, now_ms: int) -> None:
        self.start_ms = self.last_ms = now_ms
        self.rates = [0.0, 0.0, 0.0, 0.0]
        self.last_up_ms = self.last_down_ms = -(1 << 62)

    def update(self, count: float, now_ms: int, windows_ms: tuple[int, ...]) -> None:
        elapsed = now_ms - self.last_ms
        if elapsed <= 0:
            return
        self.last_ms = now_ms
        instant = count * 1000 / elapsed
        for i, window in enumerate(windows_ms):
            rate = self.rates[i]
            alpha = 1 - math.exp(-elapsed / window)
            self.rates[i] = instant if rate == 0 else rate + alpha * (instant - rate)


class RatedContainer(Protocol):
    """What the monitor reads of a container."""

    @property
    def accepted(self) -> ContainerMetadata:
        """The state whose segments count the appends (taken and reset here)."""

    @property
    def committed(self) -> ContainerMetadata:
        """The state whose segments' policies are followed."""


class AutoScaleMonitor:
    """The rules of the module docstring over the segments of a store's
    containers: :meth:`tick` every ``config.tick_ms``."""

    def __init__(self, config: AutoScalerConfig) -> None:
        self.config = config
        self._windows_ms = tuple(w * 1000 for w in config.windows_s)
        self._aggregates: dict[str, RateAggregates] = {}

    def rates(self, name: str) -> list[float] | None:
        """The segment's four rates (None: not followed)."""
        found = self._aggregates.get(name)
        return None if found is None else list(found.rates)

    def tick(self, containers: Iterable[RatedContainer], now_ms: int) -> list[ScaleRequest]:
        """Fold the counters of ``containers`` and return the requests due."""
        counts: dict[str, list[int]] = {}
        policies: dict[str, tuple[int, int]] = {}
        for container in containers:
            for s in container.accepted.segments.values():
                if s.appended_bytes or s.appended_events:
                    counted = counts.setdefault(base_segment_name(s.name), [0, 0])
                    counted[0] += s.appended_bytes
                    counted[1] += s.appended_events
                    s.appended_bytes = s.appended_events = 0
            for s in container.committed.segments.values():
                kind = s.attributes.get(SCALE_POLICY_TYPE_KEY, NO_SCALING)
                if kind != NO_SCALING and not s.sealed and not s.deleted \
                        and s.type is SegmentType.STREAM and base_segment_name(s.name) == s.name:
                    policies[s.name] = (kind, s.attributes.get(SCALE_POLICY_RATE_KEY, 0))
        for gone in [n for n in self._aggregates if n not in policies]:
            del self._aggregates[gone]
        requests = []
        for name, (kind, target) in policies.items():
            aggregates = self._aggregates.get(name)
            if aggregates is None:
                aggregates = self._aggregates[name] = RateAggregates(now_ms)
                continue
            size, events = counts.get(name, (0, 0))
            aggregates.update(size / 1024 if kind == BY_KBYTES else events, now_ms,
                              self._windows_ms)
            request = self._judge(name, aggregates, max(1, target), now_ms)
            if request is not None:
                requests.append(request)
        return requests

    def _judge(self, name: str, a: RateAggregates, target: int,
               now_ms: int) -> ScaleRequest | None:
        cfg = self.config
        age = now_ms - a.start_ms
        if age <= cfg.cooldown_s * 1000:
            return None
        w2, w5, w10, w20 = self._windows_ms
        r2, r5, r10, r20 = a.rates
        mute_ms = cfg.mute_s * 1000
        parsed = _parse(name)
        if parsed is None:
            return None
        scope, stream, segment_id = parsed
        if (r2 > 5 * target and age > w2) or (r5 > 2 * target and age > w5) \
                or (r10 > target and age > w10):
            if now_ms - a.last_up_ms > mute_ms:
                a.last_up_ms = a.last_down_ms = now_ms
                splits = max(2, int(max(r2, r5, r10) / target))
                return ScaleRequest(scope, stream, segment_id, True, splits, now_ms)
            return None
        if r2 < target and r5 < target and r10 < target and r20 < target / 2 and age > w20 \
                and now_ms - a.last_down_ms > mute_ms:
            a.last_down_ms = now_ms
            return ScaleRequest(scope, stream, segment_id, False, 0, now_ms)
        return None


def _parse(name: str) -> tuple[str, str, int] | None:
    """``(scope, stream, segment id)`` of ``scope/stream/<n>.#epoch.<e>``."""
    scope, _, rest = name.partition("/")
    stream, _, last = rest.partition("/")
    number, sep, epoch = last.partition(".#epoch.")
    if not sep or not number.isdigit() or not epoch.isdigit():
        return None
    return scope, stream, (int(epoch) << 32) | int(number)
