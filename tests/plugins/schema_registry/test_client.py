"""The registry client against a tiny in-test HTTP(S) server: caching, the negative caches,
basic auth, TLS, timeouts and the errors' wording.  Pure Python, no registry needed."""

from __future__ import annotations

import base64
import json

import pytest

from kdaemon_schema_registry.client import SchemaReference, SchemaRegistryClient
from kdaemon_schema_registry.errors import (RegistryError, RegistryUnavailable, SchemaNotFound,
                                            SchemaRegistryError)
from kdaemon_schema_registry.settings import registry_settings
from tests.plugins.schema_registry.helpers import FakeRegistry
from testkit.secure import make_pki, openssl_available, server_context

SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "int"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry():
    r = FakeRegistry()
    yield r
    r.stop()


def client(url, clock=None, **table) -> SchemaRegistryClient:
    return SchemaRegistryClient(registry_settings({"schema_registry": {"url": url, **table}}, env={}),
                                **({"clock": clock} if clock else {}))


def test_schema_by_id_is_fetched_once_and_cached_for_ever(registry):
    registry.add_schema(7, SCHEMA)
    c = client(registry.url)
    for _ in range(3):
        got = c.schema_by_id(7)
    assert json.loads(got.schema) == SCHEMA and got.schema_type == "AVRO" and got.references == ()
    assert [p for p, _ in registry.requests] == ["/schemas/ids/7"] and c.requests == 1


def test_references_and_subject_versions(registry):
    registry.add_schema(8, SCHEMA, references=[{"name": "a.B", "subject": "b value", "version": 3}])
    registry.add_version("b value", 3, SCHEMA)
    c = client(registry.url + "/")          # a trailing slash is tolerated
    assert c.schema_by_id(8).references == (SchemaReference("a.B", "b value", 3),)
    c.schema_by_version("b value", 3)
    c.schema_by_version("b value", 3)
    assert [p for p, _ in registry.requests] == ["/schemas/ids/8", "/subjects/b%20value/versions/3"]


def test_unknown_id_is_remembered_for_the_backoff_then_asked_again(registry):
    clock = Clock()
    c = client(registry.url, clock, retry_backoff_ms=5000)
    with pytest.raises(SchemaNotFound) as first:
        c.schema_by_id(9)
    assert str(first.value).startswith(f"schema id 9: not found in the registry: GET {registry.url}/schemas/ids/9 "
                                       "answered HTTP 404 (error_code 40403: Schema not found")
    assert first.value.status == 404 and first.value.error_code == 40403
    with pytest.raises(SchemaNotFound, match=r"remembered; asking again in 5\.0 s"):
        c.schema_by_id(9)
    assert c.requests == 1
    registry.add_schema(10, SCHEMA)
    c.schema_by_id(10)                      # a 404 for one id does not block the others
    registry.add_schema(9, SCHEMA)
    clock.now += 5.0
    assert c.schema_by_id(9).schema_type == "AVRO"
    assert c.requests == 3


def test_an_outage_fails_fast_for_the_backoff_and_recovers(registry):
    clock = Clock()
    registry.add_schema(1, SCHEMA)
    registry.add_schema(2, SCHEMA)
    c = client(registry.url, clock, retry_backoff_ms=2000, timeout_ms=2000)
    c.schema_by_id(1)
    registry.routes["/schemas/ids/2"] = (503, {"error_code": 50301, "message": "storage down"})
    with pytest.raises(RegistryUnavailable, match=r"^schema id 2: GET .*/schemas/ids/2 answered HTTP 503 "
                                                  r"\(error_code 50301: storage down\)$"):
        c.schema_by_id(2)
    with pytest.raises(RegistryUnavailable, match=r"schema id 3: not asked, the registry failed 0\.0 s ago "
                                                  r"\(schema id 2: .* HTTP 503 .*\); asking again in 2\.0 s"):
        c.schema_by_id(3)
    assert c.schema_by_id(1).schema_type == "AVRO"      # cached ids keep working
    assert c.requests == 2
    registry.add_schema(2, SCHEMA)
    clock.now += 2.0
    assert c.schema_by_id(2).schema_type == "AVRO"


def test_connection_refused_names_the_url():
    r = FakeRegistry()
    url = r.url
    r.stop()
    c = client(url)
    with pytest.raises(RegistryUnavailable, match=rf"^schema id 4: GET {url}/schemas/ids/4 failed: .*refused"):
        c.schema_by_id(4)


def test_a_registry_that_does_not_answer_in_time_is_an_outage(registry):
    registry.add_schema(1, SCHEMA)
    registry.delay = 1.0
    c = client(registry.url, timeout_ms=100)
    with pytest.raises(RegistryUnavailable, match=r"failed: no answer within 0\.1 s \(timeout_ms\)"):
        c.schema_by_id(1)


def test_the_next_url_is_tried_when_one_gives_no_answer(registry):
    dead = FakeRegistry()
    dead_url = dead.url
    dead.stop()
    registry.add_schema(1, SCHEMA)
    c = client([dead_url, registry.url])
    c.schema_by_id(1)
    assert c.requests == 2
    registry.add_schema(2, SCHEMA)
    c.schema_by_id(2)                       # the one that answered is asked first from now on
    assert c.requests == 3


def test_basic_auth_header_and_refusal(registry):
    registry.add_schema(1, SCHEMA)
    c = client(registry.url, username="svc", password="s3cr:et")
    c.schema_by_id(1)
    assert registry.requests[-1][1] == "Basic " + base64.b64encode(b"svc:s3cr:et").decode()
    registry.routes["/schemas/ids/2"] = (401, {"error_code": 40101, "message": "Unauthorized"})
    with pytest.raises(RegistryError, match=r"HTTP 401 \(error_code 40101: Unauthorized\): check "
                                            r"schema_registry\.username and password") as refused:
        c.schema_by_id(2)
    assert refused.value.status == 401 and "s3cr" not in str(refused.value)
    with pytest.raises(RegistryError, match=r"schema id 3: not asked, the registry failed .*HTTP 401"):
        c.schema_by_id(3)                   # remembered as what it was, not as an outage
    assert client(registry.url).schema_by_id(1) and registry.requests[-1][1] is None


def test_password_from_env_and_file(tmp_path, registry):
    registry.add_schema(1, SCHEMA)
    (tmp_path / "pw").write_text("from-file\n")
    for table, env, expected in [({"password_env": "SR_PW"}, {"SR_PW": "from-env"}, b"u:from-env"),
                                 ({"password_file": str(tmp_path / "pw")}, {}, b"u:from-file"),
                                 ({"password_file": "pw"}, {"CREDENTIALS_DIRECTORY": str(tmp_path)}, b"u:from-file")]:
        s = registry_settings({"schema_registry": {"url": registry.url, "username": "u", **table}}, env=env)
        SchemaRegistryClient(s).schema_by_id(1)
        assert registry.requests[-1][1] == "Basic " + base64.b64encode(expected).decode()


def test_a_wrong_base_url_is_named(registry):
    registry.routes["/schemas/ids/1"] = (404, b"<html>no such page</html>")
    with pytest.raises(RegistryError, match=r"answered HTTP 404 without a registry error: is url the "
                                            r"registry's base URL \(Apicurio: http://host:port/apis/ccompat/v7\)"):
        client(registry.url).schema_by_id(1)
    registry.routes["/schemas/ids/2"] = (200, b"<html>welcome</html>")
    with pytest.raises(RegistryError, match="body that is not JSON"):
        client(registry.url).schema_by_id(2)
    registry.routes["/schemas/ids/3"] = (200, {"subjects": []})
    with pytest.raises(RegistryError, match=r'without a "schema" string'):
        client(registry.url).schema_by_id(3)


def test_every_error_is_a_schema_registry_error():
    for cls in (RegistryError, RegistryUnavailable, SchemaNotFound):
        assert issubclass(cls, SchemaRegistryError)


# -- TLS -----------------------------------------------------------------------------------------

needs_openssl = pytest.mark.skipif(not openssl_available(), reason="needs the openssl command line tool")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if not openssl_available():
        pytest.skip("needs the openssl command line tool")
    return make_pki(tmp_path_factory.mktemp("pki"))


@needs_openssl
def test_tls_with_the_ca_file(pki):
    r = FakeRegistry(tls=server_context(pki.server_cert, pki.server_key))
    try:
        r.add_schema(1, SCHEMA)
        assert client(r.url, ca_file=str(pki.ca)).schema_by_id(1)
        with pytest.raises(RegistryUnavailable, match=r"GET https://.*/schemas/ids/2 failed: .*CERTIFICATE_VERIFY_FAILED"):
            client(r.url, ca_file=str(pki.other_ca)).schema_by_id(2)
        assert client(r.url, verify=False).schema_by_id(1)      # verify = false: any certificate
    finally:
        r.stop()


@needs_openssl
def test_tls_client_certificate(pki):
    r = FakeRegistry(tls=server_context(pki.server_cert, pki.server_key, client_ca=pki.ca))
    try:
        r.add_schema(1, SCHEMA)
        assert client(r.url, ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                      key_file=str(pki.client_key)).schema_by_id(1)
        with pytest.raises(RegistryUnavailable, match="failed"):
            client(r.url, ca_file=str(pki.ca)).schema_by_id(1)
    finally:
        r.stop()


@needs_openssl
def test_tls_settings_are_checked_when_built(pki, tmp_path):
    settings = registry_settings({"schema_registry": {"url": "https://r:1", "ca_file": str(pki.ca)}})
    ctx = settings.ssl_context()
    assert ctx.check_hostname and ctx.verify_mode.name == "CERT_REQUIRED"
    insecure = registry_settings({"schema_registry": {"url": "https://r:1", "verify": False}}).ssl_context()
    assert not insecure.check_hostname and insecure.verify_mode.name == "CERT_NONE"
    assert registry_settings({"schema_registry": {"url": "http://r:1"}}).ssl_context() is None
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match=r"schema_registry\.ca_file: cannot load .*bad\.pem"):
        registry_settings({"schema_registry": {"url": "https://r:1", "ca_file": str(tmp_path / "bad.pem")}})
    with pytest.raises(ValueError, match=r"schema_registry\.cert_file: cannot load the client certificate"):
        registry_settings({"schema_registry": {"url": "https://r:1", "cert_file": str(pki.client_cert),
                                               "key_file": str(pki.server_key)}})
