"""The json plugin parses with msgspec and falls back to the standard library for what msgspec
refuses: every case where the two parsers differ gives what ``json.loads`` gives (or its error,
worded without the payload), except numbers beyond a float's range, refused unless allow_nan."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

import kdaemon_json


def deserialize(data, **settings):
    return kdaemon_json.json_deserializer(settings)("t", [], data)


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (1 == 1.0 == True; -0.0 == 0.0)."""
    return json.dumps(a) == json.dumps(b) and repr(a) == repr(b)


@pytest.mark.parametrize("text", [
    "18446744073709551616",                         # 2**64: past uint64
    "-9223372036854775809",                         # past int64
    '{"id": 123456789012345678901234567890, "n": [-340282366920938463463374607431768211457]}',
])
def test_integers_beyond_64_bits_stay_exact(text):
    got = deserialize(text.encode())
    assert same(got, json.loads(text))


def test_integers_past_pythons_digit_limit_are_refused_as_by_json_loads():
    text = "1" * 5000
    with pytest.raises(ValueError) as want:
        json.loads(text)
    with pytest.raises(ValueError) as got:
        deserialize(text.encode())
    assert str(got.value) == str(want.value) and text[:50] not in str(got.value)


@pytest.mark.parametrize("text, name", [("[NaN]", "NaN"), ('{"a": Infinity}', "Infinity"),
                                         ("-Infinity", "-Infinity")])
def test_nan_and_infinity_refused_unless_allowed(text, name):
    with pytest.raises(ValueError, match=f"^{name} is not JSON .set allow_nan = true"):
        deserialize(text.encode())
    assert same(deserialize(text.encode(), allow_nan=True), json.loads(text))
    assert same(deserialize(text.encode("utf-16"), encoding="utf-16", allow_nan=True), json.loads(text))


@pytest.mark.parametrize("text", ["1e400", "[1, -1e999]", '{"a": 2.5e308}'])
def test_a_number_beyond_a_floats_range_is_refused_unless_allow_nan(text):
    with pytest.raises(ValueError, match="too large for a float .set allow_nan = true"):
        deserialize(text.encode())
    assert same(deserialize(text.encode(), allow_nan=True), json.loads(text))


@pytest.mark.parametrize("encoding, text", [
    ("latin-1", '{"name": "Müller", "n": 1}'),
    ("cp1252", '["€ 5", 18446744073709551616]'),
    ("utf-16", '{"city": "東京", "big": 123456789012345678901234567890}'),
    ("utf-8-sig", '{"bom": true}'),
])
def test_other_encodings_are_decoded_then_parsed(encoding, text):
    assert same(deserialize(text.encode(encoding), encoding=encoding), json.loads(text))


def test_bytes_that_are_not_the_encoding_are_refused_with_where():
    with pytest.raises(ValueError, match="^not valid utf-16-le: truncated data at byte 2$"):
        deserialize(b'"\x00a', encoding="utf-16-le")


@pytest.mark.parametrize("data, message", [
    (b'{"a": "\xff"}', "not valid utf-8: invalid start byte at byte 7"),
    (b'{"a": "\xc0\xaf"}', "not valid utf-8: invalid start byte at byte 7"),                 # overlong
    (b'["\xed\xa0\x80"]', "not valid utf-8: invalid continuation byte at byte 2"),           # a surrogate
    (b'["ok", "\xe2\x82"]', "not valid utf-8: invalid continuation byte at byte 8"),         # cut short
    (b'{"\xf4\x90\x80\x80": 1}', "not valid utf-8: invalid continuation byte at byte 2"),          # past U+10FFFF
])
def test_invalid_utf8_is_refused_with_where(data, message):
    with pytest.raises(UnicodeDecodeError):
        str(data, "utf-8")
    with pytest.raises(ValueError, match=f"^{message}$"):
        deserialize(data)


def test_escaped_lone_surrogates_are_read_as_json_loads_reads_them():
    text = '{"a": "\\ud800", "b": "x\\udc00y"}'
    assert deserialize(text.encode()) == json.loads(text) == {"a": "\ud800", "b": "x\udc00y"}


def test_duplicate_keys_the_last_wins_as_in_json_loads():
    text = '{"a": 1, "b": 2, "a": 3}'
    got = deserialize(text.encode())
    assert list(got.items()) == list(json.loads(text).items()) == [("a", 3), ("b", 2)]


@pytest.mark.parametrize("text", ["\n\t 7 \r\n", " [] ", '{"a": 1}\n'])
def test_whitespace_around_the_value(text):
    assert same(deserialize(text.encode()), json.loads(text))


@pytest.mark.parametrize("data, message", [
    (b'{"card": "4111-1111-1111-1111", "x": [1, 2', r"^not valid JSON: Expecting ',' delimiter at line 1 column 43$"),
    (b'{"card": "4111-1111-1111-1111",}', r"^not valid JSON: Expecting property name enclosed in double quotes "
                                          r"at line 1 column 32$"),
    (b'\n\n  {"card": "4111-1111-1111-1111"} x', r"^not valid JSON: Extra data at line 3 column 35$"),
    (b'["4111-1111-1111-1111\x01"]', r"^not valid JSON: Invalid control character at at line 1 column 22$"),
    (b"\xef\xbb\xbf{}", r"^not valid JSON: Expecting value at line 1 column 1$"),   # a BOM, as before
    (b"   ", r"^not valid JSON: Expecting value at line 1 column 4$"),
])
def test_errors_name_what_and_where_in_the_standard_librarys_words(data, message):
    with pytest.raises(ValueError, match=message) as info:
        deserialize(data)
    assert "4111" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__   # no msgspec error chained


def test_nesting_past_the_recursion_limit_is_an_error_not_a_crash():
    with pytest.raises(RecursionError):
        deserialize(b"[" * 100_000 + b"]" * 100_000)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**200, max_value=2**200)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=100, deadline=None)
@given(json_values, st.sampled_from([None, 0, 2]), st.booleans())
def test_any_json_parses_as_json_loads_parses_it(value, indent, ascii_only):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert same(deserialize(text.encode()), json.loads(text))


def test_floats_round_trip_exactly():
    for x in (0.1, 1 / 3, 2.2250738585072014e-308, 5e-324, 1.7976931348623157e308, -0.0, 1e-400, 123456789.0):
        text = repr(x) if x != 1e-400 else "1e-400"
        got = deserialize(text.encode())
        assert same(got, json.loads(text)) and (math.copysign(1, got) == math.copysign(1, json.loads(text)))
