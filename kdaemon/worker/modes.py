"""The delivery modes of a worker and the one table that moves between them.

What the worker may do next depends on one mode, and only the table ``TRANSITIONS`` moves
between modes (as h11's ``_state.py``; the group member's table in
kdaemon/client/group/state.py is the same shape).  Spreading the mode over several flags made
combinations possible that mean nothing (a held batch *and* a pending rewind); a transition
missing from the table raises ``IllegalDeliveryTransition`` instead of running on in such a
state.

* RUNNING: consuming; every flush is synchronous or none is outstanding.
* FLUSHING: a sink's ``flush_async`` (Spark) is outstanding; consuming goes on, and its
  positions are committed when it is confirmed.  One flush in flight at most.
* FULL: a flush is outstanding and the next is due (``max_buffered_records`` written since the
  first began, or a sink that does not size its own batches).  Every partition is paused until
  the confirmation, then the next flush starts.  The worker keeps polling meanwhile instead of
  blocking on the upload: a rebalance is served at once (a revoked partition of a sink that
  deduplicates by offset goes without waiting for the upload), where a wait in ``handle.wait()``
  held the whole group's rebalance for the job.
* RETRYING: a write failed under the ``retry`` policy; the batch is held, every partition is
  paused (nothing is lost and memory stays bounded) and the write is tried again with backoff.
* STALLED: a ``flush_async`` could not be confirmed because the sink is unreachable
  (``SinkUnavailable``), and the sink still holds that batch.  Every partition is paused; the
  sink is probed with backoff and the same batch is sent again (``retry()``) once it answers:
  nothing is read or staged again while the sink is down, so waiting costs no CPU and no memory.
* RESENDING: the held batch was sent again and its confirmation is outstanding.  Partitions
  stay paused until it comes: a sink that answers a probe and fails again (an uploader that is
  restarted and killed again) must not let the worker fetch a buffer's worth each time.
* REWINDING: a flush failed; the records written since the last commit may be gone with the
  sink, which is closed.  Every partition is paused until a new sink is built, then each one is
  sought back to its last commit, so those records are read and written again (duplicates in
  the sink are possible, losses are not).
* STOPPED: the sink or the DLQ refused for good (``SinkRefused``), or a record could not be
  kept anywhere.  Whatever could be committed was (nothing past the records it could not
  deliver); from now on nothing is written, flushed or committed — not by a revocation, not at
  shutdown — and the loop's next step raises the refusal, which stops the worker.  Every mode
  can end here; nothing leaves it.

A share-group worker (kdaemon/worker/share.py) moves through the same table and uses three of
its modes: RUNNING; REWINDING, where a failed write or flush released the poll's records (the
broker hands them out again: there is nothing to seek) and the sink waits to be rebuilt, with
nothing fetched meanwhile; and STOPPED.

The table is apart from kdaemon/worker/delivery.py (which acts on it) so it can be read, and
tested, on its own: tests/worker/test_delivery_modes.py checks every legal transition and
that every other pair raises.
"""

from __future__ import annotations

from enum import Enum


class Mode(Enum):
    RUNNING = "running"
    FLUSHING = "flushing"      # a flush_async is outstanding
    FULL = "full"              # one is outstanding and the next is due: paused until it is confirmed
    RETRYING = "retrying"      # a batch is held for another write
    REWINDING = "rewinding"    # a flush failed; waiting to rebuild the sink and seek back
    STALLED = "stalled"        # a flush is held by an unreachable sink; waiting to send it again
    RESENDING = "resending"    # the held flush was sent again; waiting for its confirmation
    STOPPED = "stopped"        # refused for good: nothing more is written or committed


class Event(Enum):
    FLUSH_STARTED = "flush_started"      # flush_async returned a handle
    BUFFER_FULL = "buffer_full"          # the next flush is due while one is outstanding
    FLUSH_CONFIRMED = "flush_confirmed"  # that handle reported success
    FLUSH_FAILED = "flush_failed"        # a flush (sync, async start or confirmation) failed
    FLUSH_HELD = "flush_held"            # a flush_async handle raised SinkUnavailable: batch kept
    FLUSH_RESENT = "flush_resent"        # the held flush was sent again (its handle's retry())
    WRITE_FAILED = "write_failed"        # a write failed under the retry policy (or failed again)
    WRITE_RETRIED = "write_retried"      # the held batch went through (bar records the sink refuses)
    REBUILD_FAILED = "rebuild_failed"    # the sink could not be built again yet
    REWOUND = "rewound"                  # new sink built, partitions sought back to the last commit
    REFUSED = "refused"                  # a permanent refusal (or a record kept nowhere): stop


M, E = Mode, Event

TRANSITIONS: dict[tuple[Mode, Event], Mode] = {
    (M.RUNNING, E.FLUSH_STARTED): M.FLUSHING,
    (M.FLUSHING, E.FLUSH_CONFIRMED): M.RUNNING,
    (M.RUNNING, E.FLUSH_FAILED): M.REWINDING,
    (M.FLUSHING, E.FLUSH_FAILED): M.REWINDING,
    (M.FLUSHING, E.FLUSH_HELD): M.STALLED,
    (M.FLUSHING, E.BUFFER_FULL): M.FULL,
    (M.FULL, E.FLUSH_CONFIRMED): M.RUNNING,        # and the due flush starts at once
    (M.FULL, E.FLUSH_FAILED): M.REWINDING,
    (M.FULL, E.FLUSH_HELD): M.STALLED,
    (M.STALLED, E.FLUSH_RESENT): M.RESENDING,
    (M.RESENDING, E.FLUSH_CONFIRMED): M.RUNNING,
    (M.RESENDING, E.FLUSH_HELD): M.STALLED,
    (M.RESENDING, E.FLUSH_FAILED): M.REWINDING,
    (M.STALLED, E.FLUSH_FAILED): M.REWINDING,      # the held batch is lost after all (retry raised)
    (M.RUNNING, E.WRITE_FAILED): M.RETRYING,       # after the flush before it made earlier writes durable
    (M.RETRYING, E.WRITE_FAILED): M.RETRYING,
    (M.RETRYING, E.WRITE_RETRIED): M.RUNNING,
    (M.REWINDING, E.REBUILD_FAILED): M.REWINDING,
    (M.REWINDING, E.REWOUND): M.RUNNING,
    **{(mode, E.REFUSED): M.STOPPED for mode in Mode if mode is not M.STOPPED},
}

PAUSED_MODES = frozenset({M.RETRYING, M.REWINDING, M.STALLED, M.RESENDING, M.FULL, M.STOPPED})


class IllegalDeliveryTransition(RuntimeError):
    """A transition the table does not have: a bug in the worker, never a runtime condition."""


class DeliveryModes:
    """The current mode, moved only through ``TRANSITIONS``."""

    __slots__ = ("mode",)

    def __init__(self, mode: Mode = Mode.RUNNING) -> None:
        self.mode = mode

    def apply(self, event: Event) -> Mode:
        try:
            self.mode = TRANSITIONS[(self.mode, event)]
        except KeyError:
            raise IllegalDeliveryTransition(
                f"delivery cannot handle {event.value} in mode {self.mode.value}") from None
        return self.mode

    def __repr__(self) -> str:
        return f"<DeliveryModes {self.mode.value}>"
