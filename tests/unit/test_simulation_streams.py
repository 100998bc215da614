"""quire.simulation's stream layer (``--layer streams``): segment stores,
tier-2 and controllers on the simulated ledger cluster, whole seeded runs
through ``python -m quire.simulation`` as CI runs them (each seed in its
own forked process under PYTHONHASHSEED=0)."""

from __future__ import annotations

import re
import subprocess

import pytest

from quire.simulation.streams.bugs import STREAM_BUGS
from tests.support.simulation import digest, without_cpu
from tests.support.simulation import simulate as run_simulation

CI_SEEDS = 150
"""Seeds of the stream layer CI runs (a seed costs about 1 CPU s: the
ledger layer's is 0.25); each seeded bug must be caught within them."""


def simulate(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return run_simulation("--layer", "streams", *args, timeout_s=timeout_s)


def _violations(output: str) -> set[str]:
    return set(re.findall(r"violated: ([a-z0-9-]+)", output))


@pytest.mark.timeout(600)
def test_the_same_seed_gives_the_same_run_byte_for_byte() -> None:
    first, second = simulate("--seed", "7"), simulate("--seed", "7")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert without_cpu(first.stdout) == without_cpu(second.stdout)  # the trace, all of it
    assert first.stdout.count("\n") > 100  # a real run, with its trace
    assert "faults over" in first.stdout and "clients done" in first.stdout
    many = simulate("--seeds", "3", "--first", "6", "--workers", "2", "--digests")
    assert many.returncode == 0, many.stdout[-3000:] + many.stderr[-3000:]
    assert f"seed 7: trace sha256 {digest(first.stdout)}" in many.stdout  # in any worker
    assert re.search(r"3 seeds from 6 \(streams\): 3 ok, 0 failed; \d+ events acknowledged, "
                     r"\d+ virtual s in [\d.]+ s \([\d.]+ CPU s in the runs\); "
                     r"[\d.]+ CPU s per seed", many.stdout), many.stdout[-2000:]
    assert digest(simulate("--seed", "8").stdout) != digest(first.stdout)


@pytest.mark.timeout(900)  # (about 150 CPU s on 2 cores; the machine may be shared)
def test_the_ci_seeds_hold_every_invariant() -> None:
    """CI's seeds of the stream layer, every fault on (each drawn per run)."""
    result = simulate("--seeds", str(CI_SEEDS), timeout_s=850)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert f"{CI_SEEDS} seeds from 0 (streams): {CI_SEEDS} ok, 0 failed" in result.stdout


@pytest.mark.parametrize("seed", ["3", "5", "11", "27", "28", "35", "36", "75", "100035",
                                  "100065", "100181", "100344", "101961", "102487",
                                  "103892", "104318", "105161", "105252", "105508", "106609",
                                  "107540", "108706", "115030"])
def test_seeds_that_found_real_bugs_hold(seed: str) -> None:
    """Regressions, each also pinned by a unit test of its fix:

    * 3: a request its container failed after taking it was answered
      WrongHost (not applied) though it might have been: a retried table put
      answered BadVersion for a put that had landed (the connection closes
      instead; test_segmentserver);
    * 5: a merge replayed from tier-1 whose source a later checkpoint had
      forgotten stopped the new owner's storage writer for good
      (test_segmentstore_storage_writer);
    * 11: a scale half done in the leader stayed half done while it led (its
      sweeper finishes its own workflows too; test_controller);
    * 27: SetupAppend on a sealed segment answered SegmentIsSealed, so a
      writer resent to the successors blocks the sealed segment had
      (duplicates; test_segmentserver);
    * 28: an owner whose clock was behind the previous owner's stamped
      appends earlier than those before them, and an owner replaying from
      a later checkpoint wrote a chunk sidecar whose append times went
      back (operation times never go back now; test_segmentstore_append_times);
    * 35: an owner paused past its lease answered a commit's merge "no such
      segment" for a transaction segment the new owner had made, which the
      controller took for "merged already": committed, no events
      (test_segmentstore_container);
    * 36: a truncation cut short left the stream's head naming deleted
      segments (the head is written first; test_controller);
    * 75: a writer that first set up on a segment after a scale sealed it
      and a truncation deleted it failed its events SegmentNotFound (they
      go to the successors now; test_stream_writer_recovery).
    * 100035 (found beyond CI's seeds): an owner whose storage writer started
      after a newer owner wrote tier-2's journal took over its layouts and
      deleted the chunks they named (the writer refuses to start now;
      test_segmentstore_storage_writer);
    * 100065 (beyond CI's seeds): a rolling commit that failed after marking
      its transaction COMMITTED was asked again, answered COMMITTED at once
      and ended its workflow note: the roll was never finished, the events
      stayed in a duplicate segment of no epoch (test_controller_parity);
    * 100181 (beyond CI's seeds), a bug of the checker's own: a reader round
      whose position save had no answer, but landed, was left out of the
      reader's reads, so a truncation at its later position counted those
      events lost (they are credited when the next round starts there);
    * 100344 (beyond CI's seeds): a segment deleted while tier-2 was slow to
      take its chunk got the chunk recorded with no sidecar
      (test_segmentstore_append_times);
    * 101961 (beyond CI's seeds): a stream writer that gave a connection up
      with several blocks in flight left all but the first block's failure
      unretrieved, logged when collected (test_stream_writer_recovery);
    * 102487 (beyond CI's seeds): two controllers' commits past a scale each
      planned a roll, the second over the first's, whose steps had sealed
      the duplicates both named: both hung (test_controller_model);
    * 103892 and 104318 (beyond CI's seeds): a create asked again while the
      first was in flight heard "exists" from accepted state; the first
      failed, so the segment never existed: a scale's successor (a writer's
      events refused NoSuchSegment) and the workload's conditional segment
      (test_segmentstore_container);
    * 105161 (beyond CI's seeds), the checker's own: a transaction begun on a
      controller whose clock had jumped a minute ahead has its lease end a
      minute later by the leader's clock; the wait for it to end allows for
      the controllers' clock skew now;
    * 105252 (beyond CI's seeds), the harness's own: a crashed store's
      container close, cancelled with the process, waited for ever at the
      run's clean-up, which stopped the whole soak (a crashed process's
      leftovers are not the run's failure; test_simulation);
    * 105508 (beyond CI's seeds), the checker's own: a new owner's operation,
      byte for byte one the fenced owner had appended (a client's retry
      given the same sequence number and millisecond), was counted the
      fenced owner's write after the new owner's (a record may be any of
      the owners' that appended it now);
    * 106609 (beyond CI's seeds): a store's reread of the container
      assignment, started before the assigner's change and answered after
      the watch delivered it, put the older assignment back for good: no
      store opened one container (test_segmentstore_ownership);
    * 107540 (beyond CI's seeds): a shared connection to a store still
      opening when every caller was cancelled, then failing, left its
      error unretrieved, logged when collected (test_stream_connections);
    * 108706 (beyond CI's seeds): two controllers finished one stream's
      creation at once; one made it ACTIVE, the stream was scaled and
      truncated past its first segments (deleted), and the other's late
      create made one of them again, unsealed: a writer's events were
      acknowledged there, in no epoch (one creator at a time now, claimed in
      the CREATING record; test_controller_parity). Also a refusal read from
      a change not yet durable (a seal retried hearing "sealed") now waits
      for it (test_segmentstore_container);
    * 115030 (beyond CI's seeds): two of a writer's segments sealed at once;
      the follow of one put a newer merged segment over both, then the
      other's older successor replaced it, and part of the key space had no
      segment (a follow whose segment is no longer routed changes nothing
      now; test_stream_writer_recovery).

    The product changed since, so a seed no longer draws the schedule that
    found its bug; each still runs every invariant."""
    result = simulate("--seed", seed)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"seed {seed}: ok" in result.stdout


@pytest.mark.parametrize(("bug", "invariants"), [
    ("index-before-data", {"tier2-inconsistent"}),
    ("metadata-not-last", {"acknowledged-event-lost", "read-not-durable", "recovery",
                           "transaction-not-atomic", "table-lost-update", "tier2-inconsistent",
                           "liveness"}),
    ("dedup-forgets-writer", {"event-duplicated", "recovery"}),
    ("owner-writes-after-lease", {"fenced-owner-wrote", "liveness"}),
    ("merge-applied-twice", {"event-duplicated", "transaction-not-atomic",
                             "tier2-inconsistent", "liveness"}),
    ("seal-before-successors", {"wrongly-refused", "acknowledged-event-lost", "liveness"}),
])
@pytest.mark.timeout(900)
def test_a_seeded_bug_is_caught_within_the_ci_seeds(bug: str, invariants: set[str]) -> None:
    """The run stops at the first failing seed; the failure names one of
    the invariants the bug breaks, and replaying that seed fails the same
    way (and holds with the bug off)."""
    result = simulate("--seeds", str(CI_SEEDS), "--bug", bug, "--until-failure", timeout_s=850)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    failed = re.search(r"FAILED seed (\d+)", result.stdout)
    assert failed, result.stdout[-3000:]
    found = _violations(result.stdout)
    assert found & invariants, result.stdout[-3000:]
    seed = failed.group(1)
    assert f"replay: python -m quire.simulation --seed {seed} --bug {bug} --layer streams" \
        in result.stdout
    replay = simulate("--seed", seed, "--bug", bug)
    assert replay.returncode == 1
    assert _violations(replay.stdout) == found
    assert simulate("--seed", seed).returncode == 0


def test_every_stream_bug_is_tested() -> None:
    tested = {"index-before-data", "metadata-not-last", "dedup-forgets-writer",
              "owner-writes-after-lease", "merge-applied-twice", "seal-before-successors"}
    assert set(STREAM_BUGS) == tested
