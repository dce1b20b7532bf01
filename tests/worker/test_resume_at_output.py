"""A partition given to a worker starts where the sink's output already is
(kdaemon/worker/resume.py), with a stand-in consumer and sink: the order of pause, question,
seek-and-commit and resume, and every way of giving up on the answer."""

from __future__ import annotations

from kdaemon.client.types import TopicPartition
from kdaemon.worker.resume import ResumeAtOutput

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class FakeConsumer:
    def __init__(self) -> None:
        self.known: dict[TopicPartition, int] = {}   # positions resolved so far
        self.paused: set[TopicPartition] = set()

    def positions(self):
        return dict(self.known)

    def yield_poll(self):
        self.yields = getattr(self, "yields", 0) + 1

    def pause(self, *tps):
        self.paused.update(tps)

    def resume(self, *tps):
        self.paused.difference_update(tps)


class FakeSink:
    def __init__(self) -> None:
        self.asked: list[dict] = []
        self.ready: dict = {}
        self.refuse: Exception | None = None

    def ask_resume(self, positions):
        if self.refuse is not None:
            raise self.refuse
        self.asked.append(dict(positions))

    def resume_answers(self):
        out, self.ready = self.ready, {}
        return out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _make(sink=None):
    consumer, clock = FakeConsumer(), Clock()
    holder = {"sink": sink if sink is not None else FakeSink()}
    started: list[tuple[TopicPartition, int]] = []
    r = ResumeAtOutput(consumer, lambda: holder["sink"], lambda tp, off: started.append((tp, off)),
                       clock=clock, wait_s=30)
    return r, consumer, holder, started, clock


def test_paused_until_the_answer_then_started_past_the_output():
    r, consumer, holder, started, _ = _make()
    r.assigned({A, B})
    assert consumer.paused == {A, B} and r.waiting
    assert consumer.yields == 1                # the poll that gave them returns now
    r.step()                                   # positions not known yet: nothing asked
    assert holder["sink"].asked == []
    consumer.known = {A: 100, B: 7}
    r.step()
    assert holder["sink"].asked == [{A: 100, B: 7}]
    r.step()                                   # asked once only
    assert len(holder["sink"].asked) == 1 and consumer.paused == {A, B}
    holder["sink"].ready = {A: 150, B: 7}
    r.step()
    assert started == [(A, 150)]               # B's output ends where it is: no seek, no commit
    assert consumer.paused == set() and not r.waiting


def test_no_answer_for_a_partition_reads_it_from_its_position():
    r, consumer, holder, started, _ = _make()
    r.assigned({A})
    consumer.known = {A: 5}
    r.step()
    holder["sink"].ready = {A: None}
    r.step()
    assert started == [] and consumer.paused == set()


def test_a_partition_moved_on_meanwhile_is_not_sought():
    """The position changed since the question (a mode change resumed it and it was read):
    the answer no longer applies to where it is."""
    r, consumer, holder, started, _ = _make()
    r.assigned({A})
    consumer.known = {A: 5}
    r.step()
    consumer.known = {A: 9}
    holder["sink"].ready = {A: 50}
    r.step()
    assert started == [] and consumer.paused == set()


def test_a_revoked_partition_ignores_its_late_answer():
    r, consumer, holder, started, _ = _make()
    r.assigned({A, B})
    consumer.known = {A: 5, B: 5}
    r.step()
    r.forget({A})
    consumer.paused.discard(A)                 # the consumer forgot it with the revocation
    holder["sink"].ready = {A: 50, B: 60}
    r.step()
    assert started == [(B, 60)] and A not in consumer.paused


def test_a_partition_given_again_waits_for_its_own_question():
    """Revoked and given again before the first answer came, its position not known yet: the
    late answer neither resumes it nor drops it; the next question does."""
    r, consumer, holder, started, _ = _make()
    r.assigned({A})
    consumer.known = {A: 5}
    r.step()
    r.forget({A})
    consumer.known = {}
    r.assigned({A})
    holder["sink"].ready = {A: 50}
    r.step()
    assert consumer.paused == {A} and r.waiting and started == []
    consumer.known = {A: 5}
    r.step()
    assert holder["sink"].asked == [{A: 5}, {A: 5}]
    holder["sink"].ready = {A: 60}
    r.step()
    assert started == [(A, 60)] and consumer.paused == set() and not r.waiting


def test_a_sink_that_cannot_be_asked_releases_at_once():
    sink = FakeSink()
    sink.refuse = ConnectionError("uploader down")
    r, consumer, _, started, _ = _make(sink)
    r.assigned({A})
    consumer.known = {A: 5}
    r.step()
    assert started == [] and consumer.paused == set() and not r.waiting


def test_no_answer_within_the_wait_releases():
    r, consumer, holder, started, clock = _make()
    r.assigned({A})
    consumer.known = {A: 5}
    r.step()
    clock.now = 29.0
    r.step()
    assert consumer.paused == {A}
    clock.now = 30.0
    r.step()
    assert consumer.paused == set() and not r.waiting and started == []


def test_a_new_sink_is_asked_again():
    """A rewind rebuilds the sink: the old one's question died with it."""
    r, consumer, holder, started, _ = _make()
    r.assigned({A})
    consumer.known = {A: 5}
    r.step()
    first = holder["sink"]
    holder["sink"] = FakeSink()
    r.step()
    assert holder["sink"].asked == [{A: 5}] and len(first.asked) == 1
    holder["sink"].ready = {A: 8}
    r.step()
    assert started == [(A, 8)]


def test_paused_again_after_a_mode_change_resumed_everything():
    r, consumer, _, _, _ = _make()
    r.assigned({A})
    consumer.paused.clear()                    # delivery left a paused mode: every partition resumed
    r.step()
    assert consumer.paused == {A}


def test_a_sink_without_answers_changes_nothing():
    r, consumer, _, _, _ = _make(sink=object())
    r.assigned({A})
    assert consumer.paused == set() and not r.waiting and getattr(consumer, "yields", 0) == 0
