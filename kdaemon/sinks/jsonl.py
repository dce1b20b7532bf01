"""``jsonl``: records as JSON lines in rotating files, durable when ``flush()`` returns.

Files are ``<prefix>-<UTC time>-<seq>.jsonl``.  The file being written is named
``….jsonl.open`` and renamed to ``….jsonl`` only after its last byte was fsync'ed, so a reader
that takes only ``*.jsonl`` never sees a partial file.  The line format is
``kdaemon.sinks.encoding``'s.

Invariants (each one has bitten someone):

* ``flush()`` returns only after ``os.fsync`` of the file *and*, when a file was created or
  renamed, of the directory: offsets are committed right after it, and a new file whose
  directory entry was never synced can vanish on power loss with its data.
* The rename happens after the fsync (rename first and a crash can publish a torn file).
* Every writer holds an ``flock`` on its ``.open`` file.  A ``.open`` file nobody holds belongs
  to a process that died; on start-up it is cut back to its last complete line and published,
  because what it holds was flushed and its offsets may well be committed.
* Several workers may share a directory and a prefix: names are created with ``O_EXCL`` and
  published with ``link`` + ``unlink``, which never replaces an existing file.
* After a failed write or flush, bytes that were not yet durable are cut off and the file is
  closed; the next write starts a new file, so a retried batch never lands after a torn line.
  If those bytes include records an earlier ``write()`` accepted, the sink stays broken: a
  later successful flush would let offsets be committed past records that were never stored.
* A file removed while open still accepts writes (the inode lives on): ``flush()`` checks the
  link count so such a loss is an error, not a silent success.
* Nothing is written twice (``dedupe``, on by default): a record whose (topic, partition) already
  has that offset or a later one stored in the directory is dropped before writing.  A worker
  killed between its flush and its commit leaves records its successor consumes again; they
  are recognised here (``jsonl_index.py``: per-file indexes written after each flush, the data
  files read where an index is missing or stale).  What the directory holds for a partition is
  read when the sink first writes it and again after ``on_partitions_assigned`` names it
  (another worker may have written it meanwhile); what this sink flushes itself it knows.
  In a share group (``group_type = "share"``, from ``SinkContext``) offsets do not rise per
  partition and "that offset or a later one" would drop records never written: there the sink
  keeps which offsets are stored and drops only those (``jsonl_share.py``).  ``skipped``
  counts the records not written, in either mode.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..plugins.types import Record, SinkWriteError
from ..settings import SettingsError, parse_settings, setting
from .encoding import encode_batch
from .jsonl_index import directory_high, highest_of, merge, rename_index, write_index
from .jsonl_share import SharedOffsets, spans_of

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "records"
DEFAULT_MAX_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_AGE_S = 3600.0
OPEN_SUFFIX = ".jsonl.open"
DONE_SUFFIX = ".jsonl"
_BUFFER_BYTES = 256 * 1024
_STALE_EMPTY_AGE_S = 60.0  # an empty orphan younger than this may be a writer's brand-new file
GROUP_TYPES = ("consumer", "share")


@dataclass(frozen=True)
class JsonlSettings:
    """The ``[sink]`` table of ``type = "jsonl"`` (``kdaemon.settings.parse_settings``)."""

    path: str = setting(pattern=r"(?s).+", expected="a directory path",
                        needs="the directory to write files into (created if missing)")
    prefix: str = setting(DEFAULT_PREFIX, pattern=r"[A-Za-z0-9._-]+",
                          expected="a file-name part (letters, digits, '.', '_', '-')")
    max_bytes: int = setting(DEFAULT_MAX_BYTES, min=1)
    max_age_s: float = setting(DEFAULT_MAX_AGE_S, above=0, expected="a positive number of seconds")
    fsync: bool = True
    dedupe: bool = True   # never write a stored record twice

    @classmethod
    def parse(cls, settings: Mapping) -> JsonlSettings:
        return parse_settings(cls, settings, "sink", check=_path_problems)


def _path_problems(s: JsonlSettings):
    if os.path.exists(s.path) and not os.path.isdir(s.path):
        yield "path", f"{s.path} exists and is not a directory"


class JsonlWriteError(Exception):
    """Writing, syncing or publishing a file failed.  Records written since the last
    successful ``flush()`` were not stored; files published before are intact."""


class JsonlSink:
    def __init__(self, path: str | os.PathLike, *, prefix: str = DEFAULT_PREFIX,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_age_s: float = DEFAULT_MAX_AGE_S,
                 fsync: bool = True, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, recover: bool = True,
                 dedupe: bool = True, group_type: str = "consumer") -> None:
        """``clock`` measures file age (monotonic); ``wall_clock`` names files (UTC).  Both are
        injectable for tests.  ``recover`` publishes orphaned ``.open`` files at start-up.
        ``dedupe``: drop records the directory already holds (see the module docstring).
        ``group_type``: ``SinkContext.group_type``; "share" keeps which offsets are stored
        instead of the highest (``jsonl_share.py``)."""
        if group_type not in GROUP_TYPES:
            raise ValueError(f"group_type must be one of {', '.join(GROUP_TYPES)}, not {group_type!r}")
        self.directory = os.fspath(path)
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.fsync = fsync
        self._clock = clock
        self._wall_clock = wall_clock
        self._name_re = re.compile(re.escape(prefix) + r"-\d{8}T\d{6}Z-\d+" + re.escape(OPEN_SUFFIX))
        self._seq = 0
        self._file = None           # io.BufferedWriter over the current .open file
        self._open_path = ""
        self._size = 0              # bytes handed to the file object (buffered included)
        self._durable = 0           # bytes known fsync'ed
        self._opened_at = 0.0
        self._dir_dirty = False     # a directory entry was created and not yet fsync'ed
        self.closed = False
        self._broken = ""           # why the sink refuses further use (see _fail)
        self.recovered: list[str] = []
        self.published: list[str] = []   # most recent files only; see _remember
        self.dedupe = dedupe
        self._high: dict[tuple[str, int], int] = {}      # highest offset stored, per partition
        self._fresh: set[tuple[str, int]] = set()        # partitions whose _high was read from disk
        self._pending: dict[tuple[str, int], int] = {}   # written since the last sync
        self._file_high: dict[tuple[str, int], int] = {}  # the current file's durable part
        self.skipped = 0                                   # records not written: already stored
        self.group_type = group_type
        self._share = (SharedOffsets(self.directory, prefix, OPEN_SUFFIX, DONE_SUFFIX, clock=clock)
                       if dedupe and group_type == "share" else None)
        os.makedirs(self.directory, exist_ok=True)
        if recover:
            self.recovered = self.recover_orphans()

    @classmethod
    def validate_settings(cls, settings: Mapping) -> None:
        """The checks of ``from_settings`` without creating anything (for check-config)."""
        JsonlSettings.parse(settings)

    @classmethod
    def from_settings(cls, settings: Mapping, **kwargs) -> JsonlSink:
        """Settings: ``JsonlSettings`` (``path``, the directory, is required and created if
        missing)."""
        s = JsonlSettings.parse(settings)
        try:
            return cls(s.path, prefix=s.prefix, max_bytes=s.max_bytes, max_age_s=s.max_age_s,
                       fsync=s.fsync, dedupe=s.dedupe, **kwargs)
        except OSError as exc:
            raise SettingsError("sink", [("path", f"cannot use directory {s.path}: {exc.strerror or exc}")]) \
                from exc

    # -- the Sink protocol ----------------------------------------------------------------------

    def write(self, records: Sequence[Record]) -> None:
        """Append the batch (one write call).  Records JSON cannot hold are reported with a
        ``SinkWriteError`` naming their indexes; the others are written."""
        self._check_usable("write to")
        kept = None
        if self._share is not None:
            try:
                records, kept, spans = self._not_stored_share(records)
            except OSError as exc:   # the directory is gone or unreadable
                raise self._fail("write", exc, self._size > self._durable) from exc
        elif self.dedupe:
            try:
                records, kept, highest = self._not_stored(records)
            except OSError as exc:   # the directory is gone or unreadable
                raise self._fail("write", exc, self._size > self._durable) from exc
        text, failed = encode_batch(records)
        if text:
            data = text.encode("ascii")  # the encoder escapes everything non-ASCII
            had_pending = self._size > self._durable
            try:
                if self._file is not None and self._due():
                    self._sync()
                    self._publish_current()
                if self._file is None:
                    self._open_new()
                self._file.write(data)
            except OSError as exc:
                raise self._fail("write", exc, had_pending) from exc
            self._size += len(data)
            if self._share is not None:
                if failed:   # only what was written counts
                    refused = set(failed)
                    spans = spans_of([r for i, r in enumerate(records) if i not in refused])
                self._share.written(spans)
            elif self.dedupe:
                if failed:   # only what was written counts
                    refused = set(failed)
                    highest = _highest([r for i, r in enumerate(records) if i not in refused])
                merge(self._pending, highest.items())
        if failed:
            raise SinkWriteError(f"{len(failed)} record(s) have a key or value JSON cannot hold",
                                 failed if kept is None else [kept[i] for i in failed])

    def on_partitions_assigned(self, partitions) -> None:
        """The worker got these partitions (again): another worker may have written them since,
        so what the directory holds for them is read again before the next write."""
        self._fresh.difference_update((tp.topic, tp.partition) for tp in partitions)

    def _not_stored(self, records: Sequence[Record]) -> tuple[Sequence[Record], list[int] | None,
                                                              dict[tuple[str, int], int]]:
        """The records whose offsets the directory does not hold yet, (when some were dropped)
        the index in ``records`` of each one kept, and the highest offset per partition among
        those kept.  One pass over the batch in the usual case (nothing to drop)."""
        lowest: dict[tuple[str, int], int] = {}
        highest: dict[tuple[str, int], int] = {}
        for r in records:
            tp, offset = (r.topic, r.partition), r.offset
            if tp in highest:
                if offset > highest[tp]:
                    highest[tp] = offset
                elif offset < lowest[tp]:
                    lowest[tp] = offset
            else:
                highest[tp] = lowest[tp] = offset
        if not highest.keys() <= self._fresh:
            own = os.path.basename(self._open_path[: -len(OPEN_SUFFIX)]) if self._file is not None else None
            merge(self._high, directory_high(self.directory, self.prefix, OPEN_SUFFIX, DONE_SUFFIX,
                                             own_stem=own).items())
            self._fresh |= highest.keys()
        high = self._high
        if all(low > high.get(tp, -1) for tp, low in lowest.items()):
            return records, None, highest
        kept = [i for i, r in enumerate(records) if r.offset > high.get((r.topic, r.partition), -1)]
        self.skipped += len(records) - len(kept)
        log.info("jsonl sink: %d record(s) already stored in %s (delivered again after a restart "
                 "or a rewind) not written twice", len(records) - len(kept), self.directory)
        records = [records[i] for i in kept]
        return records, kept, _highest(records)

    def _not_stored_share(self, records: Sequence[Record]):
        """``_not_stored`` in a share group: only the offsets stored (or written since the last
        flush) are dropped, wherever they lie (``jsonl_share.py``); returns the records kept,
        their indexes in ``records`` (None: all kept) and their offsets as runs per partition."""
        own = os.path.basename(self._open_path[: -len(OPEN_SUFFIX)]) if self._file is not None else None
        kept_records, kept, spans = self._share.not_stored(records, own)
        if kept is not None:
            dropped = len(records) - len(kept)
            self.skipped += dropped
            log.info("jsonl sink: %d record(s) delivered again (a lock expired or a worker stopped or crashed "
                     "after storing them) already stored in %s: not written twice (%d so far)",
                     dropped, self.directory, self.skipped)
        return kept_records, kept, spans

    def flush(self) -> None:
        """Make everything written durable; publish the file if it is full or old enough."""
        self._check_usable("flush")
        if self._file is None:
            return
        had_pending = self._size > self._durable
        try:
            self._sync()
            if self._due():
                self._publish_current()
        except OSError as exc:
            raise self._fail("flush", exc, had_pending) from exc

    def close(self) -> None:
        """Flush and publish the current file.  Idempotent; raises if records were lost."""
        if self.closed:
            return
        self.closed = True
        if self._broken:
            raise JsonlWriteError(self._broken)
        if self._file is None:
            return
        had_pending = self._size > self._durable
        try:
            self._sync()
            self._publish_current()
        except OSError as exc:
            raise self._fail("close", exc, had_pending) from exc

    def probe(self) -> str | None:
        """None if a file can be created in the directory (what a write needs next: a new
        file after a rotation or a rebuild), else why not.  A probe file, created and removed."""
        path = os.path.join(self.directory, f".{self.prefix}-probe-{os.getpid()}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            return f"cannot create a file in {self.directory}: {exc.strerror or exc}"
        try:
            os.write(fd, b"\n")   # a full disk refuses a byte, not always a name
        except OSError as exc:
            return f"cannot write in {self.directory}: {exc.strerror or exc}"
        finally:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
        return None

    def _check_usable(self, action: str) -> None:
        if self._broken:
            raise JsonlWriteError(self._broken)
        if self.closed:
            raise ValueError(f"{action} a closed jsonl sink")

    # -- files ------------------------------------------------------------------------------------

    def _due(self) -> bool:
        return self._size >= self.max_bytes or self._clock() - self._opened_at >= self.max_age_s

    def _next_stem(self) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._wall_clock()))
        self._seq += 1
        return os.path.join(self.directory, f"{self.prefix}-{stamp}-{self._seq:06d}")

    def _open_new(self) -> None:
        while True:
            stem = self._next_stem()
            if os.path.lexists(stem + DONE_SUFFIX):
                continue
            try:
                fd = os.open(stem + OPEN_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                continue
            break
        try:
            # Blocking: another process's recover_orphans() may hold it for a moment, sees an
            # empty young file and lets go.
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._file = open(fd, "wb", buffering=_BUFFER_BYTES)
        except BaseException:
            os.close(fd)
            raise
        self._open_path = stem + OPEN_SUFFIX
        self._size = self._durable = 0
        self._file_high = {}
        if self._share is not None:
            self._share.opened()
        self._opened_at = self._clock()
        self._dir_dirty = True

    def _sync(self) -> None:
        f = self._file
        f.flush()
        fd = f.fileno()
        if self.fsync:
            os.fsync(fd)
        if os.fstat(fd).st_nlink == 0:
            raise FileNotFoundError(errno.ENOENT, "the file was removed while being written",
                                    self._open_path)
        if self._dir_dirty:
            self._sync_directory()
            self._dir_dirty = False
        self._durable = self._size
        if self._share is not None:
            ranges = self._share.synced()
            if ranges is not None:
                self._write_index(highest_of(ranges), ranges)
        elif self._pending:
            merge(self._high, self._pending.items())
            merge(self._file_high, self._pending.items())
            self._pending = {}
            self._write_index(self._file_high)

    def _write_index(self, high: dict[tuple[str, int], int], ranges=None) -> None:
        """The current file's index, after its data's fsync (``jsonl_index.py``)."""
        stem = os.path.basename(self._open_path[: -len(OPEN_SUFFIX)])
        try:
            write_index(self.directory, stem, self._durable, high, ranges)
        except OSError as exc:
            # The data is durable; without its index a successor reads the file instead.
            log.warning("jsonl sink: the index of %s was not written (%s); a successor reads "
                        "the file itself to find what it holds", self._open_path, exc.strerror or exc)

    def _sync_directory(self) -> None:
        if not self.fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _publish_current(self) -> None:
        """Rename the synced current file to its final name, then let go of it (and its lock)."""
        final = self._publish(self._open_path)
        f, self._file = self._file, None
        f.close()
        self._remember(final)

    def _publish(self, open_path: str) -> str:
        """``x.jsonl.open`` → ``x.jsonl`` without ever replacing an existing file; fsyncs the
        directory.  Returns the final path."""
        final = open_path[: -len(".open")]
        while True:
            try:
                os.link(open_path, final)
            except FileExistsError:
                final = self._next_stem() + DONE_SUFFIX
                continue
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS):
                    raise
                # A file system without hard links: rename (can replace, so check first).
                while os.path.lexists(final):
                    final = self._next_stem() + DONE_SUFFIX
                os.rename(open_path, final)
                break
            os.unlink(open_path)
            break
        self._sync_directory()
        rename_index(self.directory, os.path.basename(open_path[: -len(OPEN_SUFFIX)]),
                     os.path.basename(final[: -len(DONE_SUFFIX)]))
        return final

    def _remember(self, final: str) -> None:
        self.published.append(final)
        if len(self.published) > 16:  # for tests and logs, not an ever-growing history
            del self.published[:-16]

    def _fail(self, action: str, exc: OSError, lost_accepted: bool) -> JsonlWriteError:
        """Drop the current file's non-durable tail, let go of it, and describe what happened.

        ``lost_accepted``: records from earlier ``write()`` calls that returned normally were
        not yet durable and are gone.  The caller cannot know to write them again, so the sink
        stays broken (every later call raises) rather than let a later flush succeed and
        offsets be committed past them; a new sink (a restarted worker) consumes them again.
        """
        path = self._open_path
        self._pending = {}   # not durable: the worker sends those records again
        if self._share is not None:
            self._share.lost()
        self._abandon()
        if not os.path.isdir(self.directory):
            cause = f"directory {self.directory} does not exist (was it removed?)"
        else:
            cause = f"{exc.strerror or exc} ({exc.filename or path})"
        if lost_accepted:
            self._broken = (f"jsonl sink: {action} failed: {cause}; records accepted since the last "
                            "successful flush were lost, so this sink refuses further use: restart "
                            "the worker to consume them again from the committed offsets")
            return JsonlWriteError(self._broken)
        if action == "write":
            return JsonlWriteError(f"jsonl sink: write failed: {cause}; this batch was not stored "
                                   "(earlier records are intact); write it again")
        return JsonlWriteError(f"jsonl sink: {action} failed: {cause}; no unflushed records were "
                               "lost (a file left as .jsonl.open is published on the next start-up)")

    def _abandon(self) -> None:
        f, path, durable = self._file, self._open_path, self._durable
        self._file = None
        if f is None:
            return
        held = None
        try:
            # Keep the open file (and so its flock) through a duplicate descriptor, and point
            # f's descriptor at /dev/null so closing f cannot append its unwritten buffer.
            held = os.dup(f.fileno())
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.dup2(null, f.fileno())
            finally:
                os.close(null)
        except OSError:
            pass
        try:
            f.close()
        except OSError:
            pass
        if held is None:
            return  # left as an orphan: the next start-up's recover_orphans() publishes it
        try:
            if durable == 0:
                os.unlink(path)
            else:
                os.ftruncate(held, durable)
                if self.fsync:
                    os.fsync(held)
                self._remember(self._publish(path))
        except OSError:
            pass  # same: recovered on the next start-up
        finally:
            os.close(held)

    # -- crash recovery ---------------------------------------------------------------------------

    def recover_orphans(self) -> list[str]:
        """Publish ``.open`` files of this prefix that no live writer holds.

        Each is cut back to its last complete line (a crash mid-write can leave half a line;
        those records were never acknowledged and will be consumed again).  Returns the
        published paths.
        """
        published = []
        for name in sorted(os.listdir(self.directory)):
            if not self._name_re.fullmatch(name):
                continue
            path = os.path.join(self.directory, name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live writer's file
                st = os.fstat(fd)
                if st.st_nlink == 0:
                    continue  # published or removed while we looked
                final = path[: -len(".open")]
                if os.path.lexists(final) and os.path.samestat(os.stat(final), st):
                    os.unlink(path)  # crashed between link and unlink: already published
                    continue
                if st.st_size == 0:
                    if self._wall_clock() - st.st_mtime > _STALE_EMPTY_AGE_S:
                        os.unlink(path)
                    continue
                keep = _complete_length(fd, st.st_size)
                if keep == 0:
                    os.unlink(path)
                    continue
                if keep < st.st_size:
                    os.ftruncate(fd, keep)
                if self.fsync:
                    os.fsync(fd)
                published.append(self._publish(path))
            finally:
                os.close(fd)
        return published

    def __repr__(self) -> str:
        return (f"JsonlSink({self.directory!r}, prefix={self.prefix!r}, max_bytes={self.max_bytes}, "
                f"max_age_s={self.max_age_s}, fsync={self.fsync})")


def _highest(records: Sequence[Record]) -> dict[tuple[str, int], int]:
    """The highest offset per (topic, partition) among ``records``."""
    highest: dict[tuple[str, int], int] = {}
    merge(highest, (((r.topic, r.partition), r.offset) for r in records))
    return highest


def _complete_length(fd: int, size: int) -> int:
    """Length of the file up to and including its last newline (0 if it has none)."""
    chunk = 64 * 1024
    end = size
    while end > 0:
        start = max(0, end - chunk)
        data = os.pread(fd, end - start, start)
        i = data.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0
