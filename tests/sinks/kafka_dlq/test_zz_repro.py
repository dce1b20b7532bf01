import time, uuid
from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.produce import create_topic, produce, committed_offsets

def test_repro(kafka, tmp_path):
    src = f"src-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, src, 1)
    produce(kafka.bootstrap, src, [(b"k", b"{bad", (), 1_700_000_000_000)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = daemon_config(tmp_path, kafka.bootstrap, src, group, workers=1, on_deserialize_error="dlq")
    config["plugins"] = ["json"]
    config["deserializer"] = {"key": "str", "value": "json"}
    config["dlq"] = {"type": "kafka", "topic": "missing-" + uuid.uuid4().hex[:6], "timeout_ms": 5000}
    with Daemon(tmp_path, config) as d:
        time.sleep(20)
        print(d.stop(60))
        print(d.log())
