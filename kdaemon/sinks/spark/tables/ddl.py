"""Spark's DDL type strings (``value_schema``) parsed in Python, without a JVM.

Why: the uploader's direct writes (``arrow_rows``) need ``value_schema`` as a pyspark type before
its SparkSession is up (~10 s), and ``DataType.fromDDL`` asks the JVM.  ``parse_schema`` gives
exactly what ``fromDDL`` gives (classes, nullability, ``{"comment": ...}`` metadata) for a common
subset, under Spark's default parser settings (``PARSER_CONF``).

The rule: refuse when unsure.  Anything outside the subset, and anything invalid, raises
``NotParsedHere``; the caller asks Spark's own parser once its JVM is up.  A refusal costs
seconds, a wrong guess a wrong table.

The subset (checked against Spark 4.1.1 by tests/sinks/spark/test_spark_ddl.py): BOOLEAN, TINYINT/BYTE,
SMALLINT/SHORT, INT/INTEGER, BIGINT/LONG, FLOAT/REAL, DOUBLE, DECIMAL/DEC/NUMERIC [(p[, s])],
STRING, BINARY, DATE, TIMESTAMP, TIMESTAMP_LTZ, TIMESTAMP_NTZ, ARRAY<T>, MAP<K, V>, STRUCT<...>;
fields ``name T`` or ``name: T`` with ``NOT NULL`` and ``COMMENT 'text'``; names plain (keywords
too) or backquoted; spaces, tabs, line breaks.  Refused, among others: SQL comments, CHAR,
VARCHAR, INTERVAL, VARIANT, VOID, COLLATE, DEFAULT, ``!`` for NOT, raw strings and \\u or octal
escapes, names that start with a digit, other whitespace.

As pyspark does (``PythonSQLUtils.ddlToJson``), the string is tried as a table schema
(``a INT, b STRING``), then as one type (``INT``, ``STRUCT<...>``), then as
``struct<{ddl.strip()}>`` (``a: INT, b: STRING``).  A form is passed over only where Spark
certainly fails on it too; where unsure, the whole string is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pyspark.sql import types as T

__all__ = ["NotParsedHere", "parse_schema"]


class NotParsedHere(ValueError):
    """This parser is not certain what Spark makes of the string: ask Spark."""


# Spark settings that change what the parser makes of a string, with their defaults.
PARSER_CONF = {"spark.sql.timestampType": "timestamp_ltz",           # TIMESTAMP's meaning
               "spark.sql.ansi.enforceReservedKeywords": "false",    # keywords as names
               "spark.sql.ansi.doubleQuotedIdentifiers": "false"}    # "..." a name, not a string
# (spark.sql.parser.escapedStringLiterals does not change DDL strings in Spark 4.1.1: tested.)

_SIMPLE = {"BOOLEAN": T.BooleanType, "TINYINT": T.ByteType, "BYTE": T.ByteType, "SMALLINT": T.ShortType,
           "SHORT": T.ShortType, "INT": T.IntegerType, "INTEGER": T.IntegerType, "BIGINT": T.LongType,
           "LONG": T.LongType, "FLOAT": T.FloatType, "REAL": T.FloatType, "DOUBLE": T.DoubleType,
           "STRING": T.StringType, "BINARY": T.BinaryType, "DATE": T.DateType, "TIMESTAMP": T.TimestampType,
           "TIMESTAMP_LTZ": T.TimestampType, "TIMESTAMP_NTZ": T.TimestampNTZType}
_DECIMAL = ("DECIMAL", "DEC", "NUMERIC")
_ESCAPES = {"b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}
_TOKEN = re.compile(r"[ \t\r\n]*(?:(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>[0-9]+)|(?P<bq>`)"
                    r"|(?P<str>['\"])|(?P<punct><>|[<>,:()])|(?P<end>\Z))")


class _Invalid(Exception):
    """Spark certainly fails on this form of the string too: try the next form."""


class _Unsure(Exception):
    """Spark may accept this: refuse the whole string."""


def _fail(cls, ddl: str, tok: tuple, what: str):
    kind, _, pos, end = tok
    shown = "the end" if kind == "end" else repr(ddl[pos:end] if end - pos <= 30 else ddl[pos:pos + 27] + "...")
    return cls(f"{what} at position {pos}: {shown}")


def _string(ddl: str, i: int) -> tuple[str, int]:
    """The quoted literal at ddl[i] decoded as Spark does, and the index after it."""
    quote, out, i = ddl[i], [], i + 1
    while i < len(ddl):
        c = ddl[i]
        if c == quote:
            if ddl[i + 1:i + 2] != quote:
                return "".join(out), i + 1
            out.append(quote)   # a doubled quote is one quote
            i += 2
        elif c == "\\":
            e = ddl[i + 1:i + 2]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
            elif e and "!" <= e <= "~" and e not in "uU" and not e.isdigit():
                out.append(e)    # \' \" \\ and \x for the other letters: x itself
            else:
                raise NotParsedHere(f"string escape \\{e} at position {i} is not parsed here")
            i += 2
        else:
            out.append(c)
            i += 1
    raise NotParsedHere(f"unterminated string at position {i}")


def _tokens(ddl: str) -> list[tuple]:
    """(kind, value, position, end) tuples: word (value upper-cased), name (backquoted), num, str, the
    punctuation itself, end.  Anything else (comments, other characters) is refused."""
    out, i = [], 0
    while True:
        m = _TOKEN.match(ddl, i)
        if m is None:
            j = len(ddl) - len(ddl[i:].lstrip(" \t\r\n"))
            raise NotParsedHere(f"{ddl[j:j + 2]!r} at position {j} is not parsed here")
        kind, pos = m.lastgroup, m.start(m.lastgroup)
        if kind == "end":
            out.append(("end", "", pos, pos))
            return out
        if kind == "bq":
            end = pos + 1
            while True:
                end = ddl.find("`", end)
                if end < 0:
                    raise NotParsedHere(f"unterminated backquoted name at position {pos}")
                if ddl[end + 1:end + 2] != "`":
                    break
                end += 2
            out.append(("name", ddl[pos + 1:end].replace("``", "`"), pos, end + 1))
            i = end + 1
            continue
        if kind == "str":
            value, i = _string(ddl, pos)
            out.append(("str", value, pos, i))
            continue
        i = m.end()
        if kind == "num" and re.match(r"[A-Za-z0-9_.]", ddl[i:i + 1]):
            raise NotParsedHere(f"{ddl[pos:i + 1]!r}... at position {pos} is not parsed here (a number or a name?)")
        value = m.group(kind)
        out.append(("word" if kind == "word" else kind if kind == "num" else value,
                    value.upper() if kind == "word" else value, pos, i))


class _Parser:
    def __init__(self, ddl: str, tokens: list[tuple]):
        self.ddl, self.toks, self.i = ddl, tokens, 0

    def peek(self) -> tuple:
        return self.toks[min(self.i, len(self.toks) - 1)]

    def take(self) -> tuple:
        tok = self.peek()
        self.i += 1
        return tok

    def error(self, what: str):
        """Unsure at a word or name (Spark knows words this parser does not), else invalid."""
        tok = self.peek()
        return _fail(_Unsure if tok[0] in ("word", "name") else _Invalid, self.ddl, tok, what)

    def expect(self, kind: str, what: str) -> tuple:
        if self.peek()[0] != kind:
            raise self.error(f"expected {what}")
        return self.take()

    def name(self) -> str:
        if self.peek()[0] not in ("word", "name"):
            raise self.error("expected a field name")
        tok = self.take()
        return self.ddl[tok[2]:tok[3]] if tok[0] == "word" else tok[1]

    def data_type(self) -> T.DataType:
        tok = self.peek()
        if tok[0] != "word":
            raise self.error("expected a type")
        word = self.take()[1]
        if word in _SIMPLE:
            return _SIMPLE[word]()
        if word in _DECIMAL:
            if self.peek()[0] != "(":
                return T.DecimalType(10, 0)
            self.take()
            args = [int(self.expect("num", "a number")[1])]
            while self.peek()[0] == ",":
                self.take()
                args.append(int(self.expect("num", "a number")[1]))
            close = self.expect(")", "')'")
            if len(args) > 2 or args[0] > 38 or args[-1] > args[0]:
                raise _fail(_Unsure, self.ddl, close, f"decimal precision and scale {tuple(args)} not parsed here")
            return T.DecimalType(args[0], args[1] if len(args) == 2 else 0)
        if word == "ARRAY":
            self.expect("<", "'<'")
            element = self.data_type()
            self.expect(">", "'>'")
            return T.ArrayType(element, True)
        if word == "MAP":
            self.expect("<", "'<'")
            key = self.data_type()
            self.expect(",", "','")
            value = self.data_type()
            self.expect(">", "'>'")
            return T.MapType(key, value, True)
        if word == "STRUCT":
            if self.peek()[0] == "<>":
                self.take()
                return T.StructType([])
            self.expect("<", "'<'")
            fields = []
            if self.peek()[0] != ">":
                fields = self.fields(colon=True)
            self.expect(">", "'>'")
            return T.StructType(fields)
        raise _fail(_Unsure, self.ddl, tok, "type not parsed here")

    def fields(self, colon: bool) -> list[T.StructField]:
        fields = [self.field(colon)]
        while self.peek()[0] == ",":
            self.take()
            fields.append(self.field(colon))
        return fields

    def field(self, colon: bool) -> T.StructField:
        name = self.name()
        if colon and self.peek()[0] == ":":
            self.take()
        data_type, nullable, metadata = self.data_type(), True, {}
        if self.peek()[:2] == ("word", "NOT"):
            self.take()
            if self.peek()[:2] != ("word", "NULL"):
                raise self.error("expected NULL")
            self.take()
            nullable = False
        if self.peek()[:2] == ("word", "COMMENT"):
            self.take()
            text = self.expect("str", "a string")[1]
            while self.peek()[0] == "str":   # 'a' 'b' is 'ab'
                text += self.take()[1]
            metadata = {"comment": text}
        return T.StructField(name, data_type, nullable, metadata)

    def end(self) -> None:
        if self.peek()[0] != "end":
            raise self.error("expected the end")


def parse_schema(ddl: str, *, conf: Mapping[str, object] | None = None) -> T.DataType:
    """What ``DataType.fromDDL(ddl)`` returns, or ``NotParsedHere``.

    ``conf``: the Spark settings of the session that would parse it otherwise (``[sink.conf]``);
    where one of ``PARSER_CONF`` is not its default, everything is refused."""
    if not isinstance(ddl, str):
        raise NotParsedHere(f"not a string: {type(ddl).__name__}")
    for key, default in PARSER_CONF.items():
        if str((conf or {}).get(key, default)).strip().lower() != default:
            raise NotParsedHere(f"{key} = {conf[key]!r} changes Spark's parser: not parsed here")
    tokens = _tokens(ddl)
    wrapped = [("word", "STRUCT", 0, 0), ("<", "<", 0, 0), *tokens[:-1], (">", ">", len(ddl), len(ddl)), tokens[-1]]
    first, known = tokens[0], _SIMPLE.keys() | set(_DECIMAL) | {"ARRAY", "MAP", "STRUCT"}
    errors = []
    for form, toks in (("table", tokens), ("type", tokens), ("struct", wrapped)):
        p = _Parser(ddl, toks)
        try:
            if form == "table":   # "a INT, b STRING"
                result = T.StructType(p.fields(colon=False))
            else:   # "INT", "STRUCT<a: INT>"; then "struct<" + ddl.strip() + ">" for "a: INT, b: STRING"
                if form == "type" and (first[0] == "name" or first[0] == "word" and first[1] not in known) \
                        and tokens[1][0] in (":", ","):   # a name: no type Spark knows is followed by ":" or ","
                    raise _fail(_Invalid, ddl, first, "expected a type")
                result = p.data_type()
            p.end()
            return result
        except (_Unsure, RecursionError) as exc:   # RecursionError: nested too deep for this parser
            raise NotParsedHere(str(exc)) from None
        except _Invalid as exc:
            errors.append((p.peek()[2], exc))
    raise NotParsedHere(str(max(errors, key=lambda e: e[0])[1]))   # the error furthest in
