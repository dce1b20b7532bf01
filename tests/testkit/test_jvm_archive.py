"""testkit/jvm_archive.py: an archive's name follows what the JVM checks before it maps one."""

from __future__ import annotations

import os
import shutil

import pytest

from testkit import jvm_archive


def test_a_jar_copied_again_names_another_archive(tmp_path):
    """The JVM refuses an archive when a class-path jar's modification time differs, even with
    the same bytes (a dependency resolved again), and says so on its standard output: the name
    must change with it, so that such a JVM runs without an archive instead."""
    if shutil.which("java") is None:
        pytest.skip("no java")
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    cp = f"{jar}{os.pathsep}{tmp_path / 'missing.jar'}"
    first = jvm_archive.classpath_archive("peer", cp)
    assert jvm_archive.classpath_archive("peer", cp) == first
    st = jar.stat()
    os.utime(jar, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert jvm_archive.classpath_archive("peer", cp) != first
