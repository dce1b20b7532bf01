"""The messages between a worker's spark sink and the uploader (``kdaemon.sinks.spark.wire``)."""

from __future__ import annotations

import pytest

from kdaemon.sinks.spark.tables.layout import BatchId
from kdaemon.sinks.spark.wire import PrepareHint, ResumeQuery, UploadReply, UploadRequest, decode_request, parse_line


def test_request_round_trip():
    req = UploadRequest(3, "/s/p0.parquet", "events", 0, 10, 19, 10)
    line = req.encode()
    assert line.endswith(b"\n")
    assert UploadRequest.decode(parse_line(line[:-1])) == req
    assert req.batch == BatchId(0, 10, 19)


def test_reply_round_trip():
    for reply in (UploadReply(3, True), UploadReply(4, False, "disk full"),
                  UploadReply(5, False, "Py4JJavaError: master lost", transient=True)):
        assert UploadReply.decode(reply.encode()[:-1]) == reply
    answer = UploadReply(6, True, resume={0: 120, 3: 7})
    assert UploadReply.decode(answer.encode()[:-1]) == answer
    assert b"resume" not in UploadReply(3, True).encode()
    assert b"error" not in UploadReply(3, True).encode()
    assert b"transient" not in UploadReply(4, False, "disk full").encode()


@pytest.mark.parametrize("line, exc, says", [
    (b'{"op": "delete", "id": 1}', ValueError, "unknown op 'delete'"),
    (b'{"id": 1, "file": "f", "topic": "t", "partition": 0, "first": 0, "last": 1}', KeyError, "rows"),
    (b"[1]", ValueError, "a request is a JSON object"),
])
def test_bad_requests_say_what_is_wrong(line, exc, says):
    with pytest.raises(exc, match=says):
        UploadRequest.decode(parse_line(line))
    with pytest.raises(exc, match=says):
        decode_request(parse_line(line))


def test_resume_query_round_trip_and_dispatch():
    q = ResumeQuery(7, "events", {0: 100, 2: 0})
    line = q.encode()
    assert line.endswith(b"\n")
    assert decode_request(parse_line(line[:-1])) == q
    req = UploadRequest(3, "/s/p0.parquet", "events", 0, 10, 19, 10)
    assert decode_request(parse_line(req.encode()[:-1])) == req


@pytest.mark.parametrize("line, exc, says", [
    (b'{"op": "resume", "id": 1, "topic": "t"}', KeyError, "positions"),
    (b'{"op": "resume", "id": 1, "topic": "t", "positions": [1]}', TypeError, "positions is a JSON object"),
    (b'{"op": "resume", "id": 1, "topic": "t", "positions": {"x": 1}}', ValueError, "invalid literal"),
])
def test_bad_resume_queries_say_what_is_wrong(line, exc, says):
    with pytest.raises(exc, match=says):
        decode_request(parse_line(line))


def test_prepare_hint_round_trip_and_dispatch():
    hint = PrepareHint(["/s/123/00000001-ab-p0-0-9.staged", "/s/123/00000002-cd-p1-0-9.staged"])
    line = hint.encode()
    assert line.endswith(b"\n") and b'"id"' not in line   # a hint has no reply to pair
    assert decode_request(parse_line(line[:-1])) == hint


@pytest.mark.parametrize("line, exc, says", [
    (b'{"op": "prepare"}', KeyError, "files"),
    (b'{"op": "prepare", "files": "f"}', TypeError, "files is a JSON array"),
])
def test_bad_prepare_hints_say_what_is_wrong(line, exc, says):
    with pytest.raises(exc, match=says):
        decode_request(parse_line(line))


def test_bad_reply_is_refused():
    with pytest.raises(ValueError, match="not an upload reply"):
        UploadReply.decode(b'{"ok": true}')
