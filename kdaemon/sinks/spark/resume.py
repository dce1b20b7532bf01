"""Where a partition's next owner may start reading: the first offset not known to be in the
output (the uploader's answer to a ``wire.ResumeQuery``).

After a rebalance the next owner of a partition starts at the group's commit, but the previous
owner's last upload may already be in the output, uncommitted (its confirmation came after the
revocation, which does not wait for it: kdaemon/worker/delivery.py ``on_revoked``).  Reading
those records again costs a read, a staged batch, and a job that drops every row as a
duplicate, after the batch has waited ``max_age_s``.  Starting after them instead is what Kafka
Connect's sinks do (``SinkTask.open`` and ``SinkTaskContext.offset``).

What counts as "in the output" is exactly what the uploader already drops as duplicates
(``uploader.Uploader.upload``), one definition for both: ``formats.uploaded_ranges``, every
manifest's range, and for a Delta or Iceberg table every offset up to the one the table
recorded for the partition.  So skipping is never less safe
than reading again: the records skipped are the ones a re-read would have dropped.  A gap
between two manifests (records the workers filtered out, never in a batch) ends the walk: the
answer can only be early, never late.
"""

from __future__ import annotations

from .tables import formats


def resume_point(ranges: list[tuple[int, int]], start: int) -> int:
    """The first offset at or after ``start`` that no range (first, last inclusive) covers,
    following ranges that touch or overlap."""
    pos = start
    for first, last in sorted(ranges):
        if first > pos:
            break
        if last >= pos:
            pos = last + 1
    return pos


def resume_points(root: str, fmt: str, topic: str, positions: dict[int, int]) -> dict[int, int]:
    """Per partition of ``topic``, where its next owner may start instead of ``positions``:
    never before the position itself."""
    ranges = formats.uploaded_ranges(root, fmt, [(topic, p) for p in positions])
    return {p: resume_point(ranges[(topic, p)], start) for p, start in positions.items()}
