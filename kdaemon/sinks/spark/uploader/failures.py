"""Why a Spark job failed, as the uploader must act on it: transient, deterministic or permanent.

A job that failed used to be answered "transient" whatever the cause, and the worker sent the
same batch again for ever (one ERROR line every few seconds, the partition stalled), even when
the cause could not go away: a table whose schema does not take the rows, an analysis error, a
JVM whose classes do not match their jars.  ``classify`` tells them apart, once, for the
uploader (``uploader.Uploader._run_job``):

* TRANSIENT — the job may well pass next time: a connection to the JVM lost (Py4J's network
  errors), a Python I/O error, an executor or the master gone (``SparkException``, Java's
  ``IOException``), or anything not recognised below.  The worker keeps its batch and sends it
  again once the uploader answers (``SinkUnavailable``), with backoff.
* DETERMINISTIC — the same job fails the same way every time: Spark's ``AnalysisException`` and
  ``ParseException``, an illegal argument, an unsupported operation, a class not found, a Delta
  invariant, the table's schema (``writer.SchemaMismatch``), a Delta table delta-rs cannot read
  (``delta_state.DeltaUnreadable``: a reader feature it does not know), a Py4J call the JVM refuses as
  such (``py4j.Py4JException``: a method or field it does not have).  The uploader tries ``DETERMINISTIC_ATTEMPTS``
  times in a row (a table being recreated, a mistaken reading of a message), then refuses.
* PERMANENT — a JVM linkage error (``LinkageError`` and its kin: ``NoSuchMethodError``,
  ``NoClassDefFoundError``, ``IncompatibleClassChangeError``, ``UnsupportedClassVersionError``,
  ...): the jars on ``spark.jars`` were built for another Spark, Scala or Java, and no retry
  changes the classes a JVM has loaded.  Refused at once.  So is a row the table refuses for
  what it holds under ``daemon.on_sink_error = "stop"`` (``uploader.StoppedAtRefusedRows``):
  the policy says to stop at it, and the record never changes.

A row the table refuses under the other policies is no failure of the job: the uploader writes
it to the output's dead letters and appends the rest (``refused_rows``).  Only when that cannot
keep it out (a refusal it has no condition for) does the job fail, as ``RowsRefused``:
deterministic.

A refusal reaches the worker as the sinks' one permanent error (``SinkRefused``), and it stops
the daemon naming the output and the fix (``EXIT_SINK_REFUSED``).

The exceptions are read without a JVM: a Py4J error's message comes from the JVM when it is
printed (``str()`` on a dead gateway raises), so the text is taken from what the Python side
already holds where it can be, and class names, Python's and Java's (``java.lang.X: ...`` in a
message or stack trace), are matched by their simple names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TRANSIENT, DETERMINISTIC, PERMANENT = "transient", "deterministic", "permanent"

# Consecutive failures of one deterministic kind before the uploader refuses the job's batches.
DETERMINISTIC_ATTEMPTS = 3

# java.lang.LinkageError and its subclasses.
_LINKAGE = frozenset({"LinkageError", "IncompatibleClassChangeError", "NoSuchMethodError", "NoSuchFieldError",
                      "AbstractMethodError", "IllegalAccessError", "InstantiationError", "NoClassDefFoundError",
                      "UnsupportedClassVersionError", "ClassFormatError", "ClassCircularityError", "VerifyError",
                      "ExceptionInInitializerError", "BootstrapMethodError"})
# Python's (pyspark's, kdaemon's) and Java's exceptions for a job that cannot pass as it is.
_DETERMINISTIC = frozenset({
    "AnalysisException", "ParseException", "IllegalArgumentException", "UnsupportedOperationException",
    "ClassNotFoundException", "SparkUpgradeException", "NoSuchTableException", "NoSuchNamespaceException",
    "InvariantViolationException", "DeltaInvariantViolationException", "DeltaAnalysisException",
    "DeltaIllegalArgumentException", "DeltaUnsupportedOperationException", "PySparkValueError",
    "PySparkTypeError", "PySparkAttributeError", "SchemaMismatch", "OutputNotShared", "Py4JException",
    "RowsRefused", "DeltaUnreadable"})
# kdaemon's: a row the table refuses, and daemon.on_sink_error says to stop at it.
_STOP_POLICY = frozenset({"StoppedAtRefusedRows"})
# A Py4J error with one of these is the JVM's connection going away, not the job.
_CONNECTION_LOST = ("Answer from Java side is empty", "Error while receiving", "Error while sending",
                    "Error while obtaining a new communication channel", "Connection refused",
                    "Java side is empty")
_JAVA_CLASS = re.compile(r"\b(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Error|Exception))\b")

_LINKAGE_FIX = ("the JVM's classes do not match their jars (a Delta or Iceberg jar built for another Spark, Scala "
                "or Java version on spark.jars, or in [sink] conf): stage the jars pinned for this pyspark "
                "(python -m kdaemon.sinks.spark.tables.jars delta|iceberg) and remove any other, then start the daemon "
                "again")
_STOP_POLICY_FIX = ("the table refuses a row for what it holds (a CHECK constraint, a NOT NULL column) and "
                    "daemon.on_sink_error = \"stop\": set on_sink_error to \"retry\" or \"dlq\" to write such rows to "
                    "the output's _kdaemon/dlq and append the rest, or drop or change the table's constraint; then "
                    "start the daemon again (it reads on from the last commit)")
_DETERMINISTIC_FIX = ("the job fails the same way every time: fix what the error names (the table, its schema, "
                      "[sink] value_schema, partition_by or path), then start the daemon again; it reads on "
                      "from the last commit")


@dataclass(frozen=True)
class Failure:
    kind: str         # TRANSIENT, DETERMINISTIC or PERMANENT
    names: tuple      # the exception names it was told by (for the log and the tests)
    fix: str = ""     # what an operator changes (DETERMINISTIC, PERMANENT)


def classify(exc: BaseException) -> Failure:
    """What ``exc``, a job's failure, means for the next attempt (see the module docstring)."""
    names = _names(exc)
    linkage = tuple(n for n in names if n in _LINKAGE)
    if linkage:
        return Failure(PERMANENT, linkage, _LINKAGE_FIX)
    if _connection_lost(exc):
        return Failure(TRANSIENT, names)
    stop = tuple(n for n in names if n in _STOP_POLICY)
    if stop:
        return Failure(PERMANENT, stop, _STOP_POLICY_FIX)
    found = tuple(n for n in names if n in _DETERMINISTIC)
    if found:
        return Failure(DETERMINISTIC, found, _DETERMINISTIC_FIX)
    return Failure(TRANSIENT, names)


def text(exc: BaseException) -> str:
    """What ``exc`` says, without asking a JVM that may be gone: pyspark's captured exceptions
    keep their description and stack trace; a ``Py4JJavaError``'s message is the JVM's, asked
    only as a last resort."""
    desc = getattr(exc, "_desc", None)
    if desc is not None:
        return f"{desc}\n{getattr(exc, '_stackTrace', '') or ''}"
    try:
        return str(exc)
    except BaseException:   # a Py4JJavaError whose gateway is gone: its own message only
        return str(getattr(exc, "errmsg", "") or type(exc).__name__)


def _chain(exc: BaseException):
    """``exc``, its causes and contexts, and pyspark's captured causes."""
    seen = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen or not isinstance(e, BaseException):
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "_cause", None)]


def _names(exc: BaseException) -> tuple:
    """Every exception class name in ``exc``'s chain (with their Python base classes) and every
    Java exception class named in their texts, by simple name, in order, once."""
    out: list[str] = []
    for e in _chain(exc):
        out += [c.__name__ for c in type(e).__mro__ if issubclass(c, BaseException)]
        out += _JAVA_CLASS.findall(text(e))
    return tuple(dict.fromkeys(out))


def _is_py4j(e: BaseException) -> bool:
    return any(c.__module__.startswith("py4j") for c in type(e).__mro__)


def _is_java(e: BaseException) -> bool:
    return any(c.__name__ == "Py4JJavaError" for c in type(e).__mro__)


def _connection_lost(exc: BaseException) -> bool:
    for e in _chain(exc):
        kinds = {c.__name__ for c in type(e).__mro__}
        if "Py4JNetworkError" in kinds or (isinstance(e, OSError) and not _is_py4j(e)):
            return True
        if _is_py4j(e) and not _is_java(e) and any(marker in text(e) for marker in _CONNECTION_LOST):
            return True
    return False
