"""One test per fuzzer finding (fuzz/, issue #15): the input, reduced to what matters, and the
behaviour the fix restored.  Each names the target that found it."""

from __future__ import annotations

import pytest

from kdaemon.protocol import record_loop, records
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.errors import CorruptRecordError
from kdaemon.protocol.header_match import HeaderRule, HeaderRules

needs_c = pytest.mark.skipif(not records.ACCELERATED, reason="C record loop not built or disabled")


def _read(monkeypatch, data: bytes, loop: str, header_filter, **options):
    if loop == "python":
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.python_loop)
        monkeypatch.setattr(records, "ACCELERATED", False)
    else:
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.accelerated_loop)
        monkeypatch.setattr(records, "ACCELERATED", True)
    reader = records.RecordSetReader(memoryview(data), topic="t", partition=0, fetch_offset=0,
                                     header_filter=header_filter, **options)
    return reader.read_all()


def _batch_with_bad_header_key() -> bytes:
    """A batch whose second record has a header key that is not UTF-8 (0xE4 0x80: a 3-byte
    sequence cut short), the rest well formed.  Built with 'ÿ' (C3 BF) and patched, so the CRC
    no longer matches: read with check_crcs=False, as the fuzzer's mode did."""
    data = build_batch([RecordSpec(b"k0", b"v0", [("keep", b"1")]),
                        RecordSpec(b"k1", b"v1", [("drop", b"x"), ("\u00ff", b"y")])])
    assert data.count("\u00ff".encode()) == 1
    return data.replace("\u00ff".encode(), b"\xe4\x80")


@pytest.mark.parametrize("loop", ["python", pytest.param("c", marks=needs_c)])
@pytest.mark.parametrize("native", [True, False], ids=["native-rules", "python-callable"])
def test_header_key_not_utf8_is_corrupt_even_when_the_native_filter_drops_the_record(monkeypatch, loop, native):
    """records_c: the C loop's native rules dropped the record without decoding its header
    keys, so a key that is not UTF-8 went unnoticed there while the Python loop (and the C loop
    with a callable filter) reported the batch corrupt.  Both loops now reject it, whatever the
    filter."""
    rules = HeaderRules([HeaderRule("drop", "exists", keep=False)], default=True)
    assert rules.native_rules is not None
    header_filter = rules if native else (lambda headers: rules(headers))
    with pytest.raises(CorruptRecordError, match="UnicodeDecodeError"):
        _read(monkeypatch, _batch_with_bad_header_key(), loop, header_filter, check_crcs=False)


@pytest.mark.xfail(strict=True, raises=UnicodeDecodeError,
                   reason="config target: kdaemon/config is the config helper's; reported to the lead. "
                          "Strict: this xfail fails as soon as load() raises ConfigError, so remove it then.")
def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    """config: ``load`` catches TOMLDecodeError only, but tomllib decodes the file as UTF-8
    first, so one stray byte (0xFF) lets a bare UnicodeDecodeError out instead of a ConfigError
    naming the file."""
    from kdaemon.config import ConfigError, load
    path = tmp_path / "kdaemon.toml"
    path.write_bytes(b'[daemon]\ntopics = ["orders\xff"]\n')
    with pytest.raises(ConfigError, match="kdaemon.toml"):
        load(path)
