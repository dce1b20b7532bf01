"""HeaderRules: rule semantics as a Python callable, the native form, and C/Python parity.

Every semantic case is a (rules, default, headers, expected) row.  The row is checked three ways:
calling HeaderRules directly, decoding a batch with the pure-Python loop (which calls it), and
decoding the same batch with the C loop given ``native_rules`` (or the callable, for rule lists
that have no native form).  Both loops must agree with the table, with each other, on the
filtered count and on the final position.
"""

from __future__ import annotations

import re

import pytest

from kdaemon.protocol import record_loop, records
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from kdaemon.protocol.records import CREATE_TIME, RecordSetReader

needs_c = pytest.mark.skipif(not records.ACCELERATED, reason="C record loop not built or disabled")

R = HeaderRule
BIG_SET = tuple(f"tenant-{i}" for i in range(40))  # > 16 values: the frozenset path
MANY = [(f"h{i}", f"v{i}".encode()) for i in range(40)]

# (id, rules, default, headers, expected keep)
CASES = [
    ("no rules keep", [], True, [("a", b"1")], True),
    ("no rules drop", [], False, [("a", b"1")], False),
    ("equals match", [R("type", "equals", ("order",))], False, [("type", b"order")], True),
    ("equals longer value", [R("type", "equals", ("order",))], False, [("type", b"orders")], False),
    ("equals shorter value", [R("type", "equals", ("order",))], False, [("type", b"orde")], False),
    ("equals absent", [R("type", "equals", ("order",))], False, [("other", b"order")], False),
    ("equals null value", [R("type", "equals", ("order",))], False, [("type", None)], False),
    ("equals empty value", [R("type", "equals", (b"",))], False, [("type", b"")], True),
    ("equals empty vs null", [R("type", "equals", (b"",))], False, [("type", None)], False),
    ("equals drop rule", [R("type", "equals", ("debug",), keep=False)], True, [("type", b"debug")], False),
    ("equals drop rule no match", [R("type", "equals", ("debug",), keep=False)], True, [("type", b"x")], True),
    ("equals binary value", [R("b", "equals", (b"\x00\xff\x00",))], False, [("b", b"\x00\xff\x00")], True),
    ("equals str is utf-8", [R("u", "equals", ("é",))], False, [("u", "é".encode())], True),
    ("equals latin-1 is not utf-8", [R("u", "equals", ("é",))], False, [("u", "é".encode("latin-1"))], False),
    ("key is case sensitive", [R("Type", "equals", ("order",))], False, [("type", b"order")], False),
    ("key prefix is not key", [R("type", "exists")], False, [("typ", b"x"), ("types", b"x")], False),
    ("unicode key", [R("ключ", "equals", ("да",))], False, [("ключ", "да".encode())], True),
    ("in small first", [R("t", "in", ("a", "bb", "ccc"))], False, [("t", b"a")], True),
    ("in small last", [R("t", "in", ("a", "bb", "ccc"))], False, [("t", b"ccc")], True),
    ("in small miss", [R("t", "in", ("a", "bb", "ccc"))], False, [("t", b"cc")], False),
    ("in small null", [R("t", "in", ("a", "bb"))], False, [("t", None)], False),
    ("in exactly 16", [R("t", "in", tuple(str(i) for i in range(16)))], False, [("t", b"15")], True),
    ("in 17 values", [R("t", "in", tuple(str(i) for i in range(17)))], False, [("t", b"16")], True),
    ("in big first", [R("t", "in", BIG_SET)], False, [("t", b"tenant-0")], True),
    ("in big last", [R("t", "in", BIG_SET)], False, [("t", b"tenant-39")], True),
    ("in big miss", [R("t", "in", BIG_SET)], False, [("t", b"tenant-40")], False),
    ("in big null", [R("t", "in", BIG_SET)], False, [("t", None)], False),
    ("in big drop", [R("t", "in", BIG_SET, keep=False)], True, [("t", b"tenant-7")], False),
    ("prefix match", [R("region", "prefix", ("eu-",))], False, [("region", b"eu-west-1")], True),
    ("prefix equal", [R("region", "prefix", ("eu-",))], False, [("region", b"eu-")], True),
    ("prefix shorter value", [R("region", "prefix", ("eu-",))], False, [("region", b"eu")], False),
    ("prefix miss", [R("region", "prefix", ("eu-",))], False, [("region", b"us-east")], False),
    ("prefix null", [R("region", "prefix", ("eu-",))], False, [("region", None)], False),
    ("prefix empty matches any", [R("region", "prefix", (b"",))], False, [("region", b"")], True),
    ("prefix empty not null", [R("region", "prefix", (b"",))], False, [("region", None)], False),
    ("regex match", [R("id", "regex", (rb"^[0-9]{3}-x$",))], False, [("id", b"123-x")], True),
    ("regex miss", [R("id", "regex", (rb"^[0-9]{3}-x$",))], False, [("id", b"12-x")], False),
    ("regex search not match", [R("id", "regex", ("x",))], False, [("id", b"aax")], True),
    ("regex null", [R("id", "regex", (".*",))], False, [("id", None)], False),
    ("regex absent", [R("id", "regex", (".*",))], False, [], False),
    ("exists", [R("trace", "exists")], False, [("trace", b"abc")], True),
    ("exists with null value", [R("trace", "exists")], False, [("trace", None)], True),
    ("exists absent", [R("trace", "exists")], False, [("other", None)], False),
    ("missing", [R("trace", "missing")], False, [("other", b"1")], True),
    ("missing present", [R("trace", "missing")], False, [("trace", None)], False),
    ("missing no headers", [R("trace", "missing", keep=False)], True, [], False),
    ("first match decides keep",
     [R("type", "equals", ("order",)), R("type", "exists", keep=False)], False, [("type", b"order")], True),
    ("first match decides drop",
     [R("type", "equals", ("debug",), keep=False), R("tenant", "exists")], False,
     [("type", b"debug"), ("tenant", b"a")], False),
    ("falls through to second",
     [R("type", "equals", ("debug",), keep=False), R("tenant", "exists")], False,
     [("type", b"order"), ("tenant", b"a")], True),
    ("falls through to default",
     [R("type", "equals", ("debug",), keep=False), R("tenant", "exists")], True, [("type", b"x")], True),
    ("last occurrence wins (miss)",
     [R("type", "equals", ("order",))], False, [("type", b"order"), ("type", b"debug")], False),
    ("last occurrence wins (hit)",
     [R("type", "equals", ("order",))], False, [("type", b"debug"), ("type", b"order")], True),
    ("last occurrence null",
     [R("type", "equals", ("order",))], False, [("type", b"order"), ("type", None)], False),
    ("last occurrence null exists",
     [R("type", "exists")], False, [("type", b"order"), ("type", None)], True),
    ("last occurrence prefix",
     [R("r", "prefix", ("eu",))], False, [("r", b"us"), ("x", b"eu"), ("r", b"eu-1")], True),
    ("last occurrence big set",
     [R("t", "in", BIG_SET)], False, [("t", b"tenant-1"), ("t", b"nope")], False),
    ("empty key", [R("", "equals", ("v",))], False, [("", b"v")], True),
    ("many headers decisive late",
     [R("h39", "equals", ("v39",))], False, MANY, True),
    ("many headers repeated late",
     [R("h3", "equals", ("v3",))], False, MANY + [("h3", b"changed")], False),
    ("many headers missing",
     [R("h40", "missing", keep=False)], True, MANY, False),
    ("many headers with regex",
     [R("h35", "regex", ("^v3",))], False, MANY, True),
    ("mixed native and regex",
     [R("type", "equals", ("debug",), keep=False), R("id", "regex", ("^a",))], False,
     [("id", b"abc")], True),
]


def _rules(rules, default):
    return HeaderRules(list(rules), default=default)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rules_as_callable(case):
    _, rules, default, headers, expected = case
    assert _rules(rules, default)(headers) is expected


def _loop(fn, payload, count, header_filter, min_offset=0):
    out: list = []
    pos, filtered = fn(payload, 0, count, 0, 1_000, None, CREATE_TIME, None, "t", 0, min_offset,
                       header_filter, out)
    return [(r.offset, r.key, r.headers) for r in out], pos, filtered


def _case_batch(headers):
    # Keeper records without headers around the case record, so a loop that loses its place
    # after a filtered record would show.
    recs = [RecordSpec(key=b"before", value=b"b"), RecordSpec(key=b"case", value=b"c", headers=headers),
            RecordSpec(key=b"after", value=b"a")]
    return build_batch(recs)[records.BATCH_HEADER_SIZE:]


@needs_c
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_c_and_python_loops_agree_with_the_table(case):
    _, rules, default, headers, expected = case
    hr = _rules(rules, default)
    payload = _case_batch(headers)
    # The two neighbours have no headers: they get what the rules give an empty header list.
    neighbours = hr([])
    want_keys = [k for k, keep in ((b"before", neighbours), (b"case", expected), (b"after", neighbours)) if keep]
    py = _loop(record_loop.python_loop, payload, 3, hr)
    c_callable = _loop(record_loop.accelerated_loop, payload, 3, hr)
    results = [py, c_callable]
    if hr.native_rules is not None:
        results.append(_loop(record_loop.accelerated_loop, payload, 3, hr.native_rules))
    for got in results:
        assert [k for _, k, _ in got[0]] == want_keys
        assert got[1] == len(payload)
        assert got[2] == 3 - len(want_keys)
        assert got == py


@needs_c
@pytest.mark.parametrize("min_offset", [0, 1, 2, 3])
def test_parity_with_records_before_the_position(min_offset):
    hr = HeaderRules([R("k", "equals", ("yes",))], default=False)
    recs = [RecordSpec(key=bytes([i]), headers=[("k", b"yes" if i % 2 else b"no")]) for i in range(4)]
    payload = build_batch(recs)[records.BATCH_HEADER_SIZE:]
    py = _loop(record_loop.python_loop, payload, 4, hr, min_offset)
    native = _loop(record_loop.accelerated_loop, payload, 4, hr.native_rules, min_offset)
    assert native == py
    assert [o for o, _, _ in py[0]] == [i for i in range(min_offset, 4) if i % 2]
    assert py[2] == len([i for i in range(min_offset, 4) if not i % 2])


def test_native_form():
    small = HeaderRules([R("a", "in", ("x", "y")), R("b", "prefix", ("p",), keep=False), R("c", "exists"),
                         R("d", "missing", keep=False), R("e", "equals", ("z",))], default=False)
    assert small.native_rules == ((
        (0, b"a", (b"x", b"y"), True),
        (3, b"b", b"p", False),
        (1, b"c", None, True),
        (2, b"d", None, False),
        (0, b"e", (b"z",), True),
    ), False)
    big = HeaderRules([R("ключ", "in", BIG_SET)])
    ((kind, key, arg, keep),), default = big.native_rules
    assert (kind, key, keep, default) == (0, "ключ".encode(), True, True)
    assert isinstance(arg, frozenset) and arg == frozenset(v.encode() for v in BIG_SET)
    sixteen = HeaderRules([R("a", "in", tuple(str(i) for i in range(16)))])
    assert isinstance(sixteen.native_rules[0][0][2], tuple)
    assert HeaderRules([R("a", "exists"), R("b", "regex", ("x",))]).native_rules is None


def test_reader_hands_native_rules_to_the_c_loop_only_when_accelerated():
    hr = HeaderRules([R("a", "exists")])
    reader = RecordSetReader(b"", topic="t", partition=0, fetch_offset=0, header_filter=hr)
    if records.ACCELERATED:
        assert reader._v2_filter is hr.native_rules
    else:
        assert reader._v2_filter.__wrapped__ is hr  # called through the error guard
    regex = HeaderRules([R("a", "regex", ("x",))])
    assert RecordSetReader(b"", topic="t", partition=0, fetch_offset=0,
                           header_filter=regex)._v2_filter.__wrapped__ is regex


def test_a_raising_filter_is_not_reported_as_corrupt_data():
    recs = [RecordSpec(key=b"k", headers=[("a", b"1")])]

    def bad(headers):
        raise ValueError("plugin bug")

    reader = RecordSetReader(build_batch(recs), topic="t", partition=0, fetch_offset=0, header_filter=bad)
    with pytest.raises(records.HeaderFilterError) as info:
        reader.read_all()
    assert isinstance(info.value.__cause__, ValueError)


def test_reader_with_rules_end_to_end():
    recs = [RecordSpec(key=b"%d" % i, headers=[("tenant", b"acme" if i % 3 == 0 else b"other")]) for i in range(9)]
    hr = HeaderRules([R("tenant", "equals", ("acme",))], default=False)
    reader = RecordSetReader(build_batch(recs), topic="t", partition=0, fetch_offset=0, header_filter=hr)
    assert [r.offset for r in reader.read_all()] == [0, 3, 6]
    assert reader.filtered == 6 and reader.next_offset == 9


@pytest.mark.parametrize("op, values", [("bogus", ("x",)), ("equals", ()), ("equals", ("a", "b")),
                                        ("prefix", ()), ("regex", ("a", "b")), ("in", ())])
def test_rule_validation(op, values):
    with pytest.raises(ValueError):
        R("k", op, values)


def test_bad_regex_fails_at_configuration():
    with pytest.raises(re.error):
        R("k", "regex", ("(unclosed",))


def test_values_are_stored_as_bytes():
    rule = R("k", "in", ("é", b"\xff"))
    assert rule.values == ("é".encode(), b"\xff")
    assert R("k", "exists").values == ()


def test_repr_names_rules_and_default():
    text = repr(HeaderRules([R("k", "exists")], default=False))
    assert "exists" in text and "default=False" in text


# --- one vocabulary: the daemon's [[filters]] and the header_rules plugin's [[rules]] ----------

BAD_TABLES = [
    ({"header": "h", "op": "like", "value": "a"}, "op", "'like' is not one of equals, in, prefix, regex, exists, missing"),
    ({"header": "h", "values": ["a", "b"]}, "value", "op 'equals' takes exactly one value"),
    ({"header": "h", "op": "in"}, "values", "op 'in' needs at least one value"),
    ({"header": "h", "op": "regex", "value": "("}, "value", "not a valid regular expression"),
    ({"header": "h", "value": "a", "action": "skip"}, "action", "must be \"keep\" or \"drop\""),
    ({"op": "exists"}, "header", "required"),
]
# Not here: a value of the wrong TOML type ("values = [1]"), which the daemon's loader reports
# before the rule's own checks, as every type problem: "filters[0].values[0]: expected a string,
# found integer 1" (tests/config/test_config_types.py).


@pytest.mark.parametrize("table, field, text", BAD_TABLES)
def test_config_and_rules_file_reject_a_rule_in_the_same_words(tmp_path, table, field, text):
    from kdaemon.config import ConfigError, parse
    from kdaemon.protocol.header_match import rule_problems
    from kdaemon_header_rules import load_rules
    from kdaemon.config import dump_toml

    assert any(f == field and text in t for f, t in rule_problems(table)), rule_problems(table)
    with pytest.raises(ConfigError) as config_error:
        parse({"kafka": {"bootstrap_servers": "x:1"}, "daemon": {"topics": ["t"]},
               "filters": [table], "sink": {"type": "null"}})
    rules_path = tmp_path / "rules.toml"
    rules_path.write_text(dump_toml({"rules": [table]}))
    with pytest.raises(ValueError) as file_error:
        load_rules(str(rules_path))
    assert f"filters[0].{field}: {text}" in str(config_error.value)
    assert f"rules[0].{field}: {text}" in str(file_error.value)


def test_auto_default_is_the_opposite_of_the_last_rule():
    from kdaemon.protocol.header_match import resolve_default
    keep, drop = R("k", "exists"), R("k", "exists", keep=False)
    assert resolve_default("auto", [keep]) is False          # keep rules: an allowlist
    assert resolve_default("auto", [keep, drop]) is True     # ending with drop: a blocklist
    assert resolve_default("auto", []) is True
    assert resolve_default("keep", [keep]) is True and resolve_default("drop", [drop]) is False
    with pytest.raises(ValueError, match="one of keep, drop, auto"):
        resolve_default("sometimes", [keep])
