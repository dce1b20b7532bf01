"""``kdaemon run`` (2 workers, Tansu) while slow clients hold both of the supervisor's endpoints.

What froze the daemon: 40 connections to ``/metrics`` each trickling a byte every 1.5 s.  The
supervisor read each request with a blocking 2-s timeout inside the loop that also reaps and
replaces workers and acts on signals, so a scrape timed out, a SIGKILLed worker was not
replaced and SIGTERM did nothing (under systemd's ``WatchdogSec``, the daemon would have been
killed).  Here 40 trickling and 10 silent clients hold ``/metrics`` and as many the control
socket, every one of them accepted by the supervisor (its own sockets, through psutil), and
while they are all still connected: a scrape is answered, ``kdaemon status`` is answered, a
SIGKILLed worker's replacement is started, and SIGTERM stops the daemon with 0, each within
the harness's usual waits.  ``endpoint_request_timeout_s`` is set far above the test's length so
that no client is dropped on the way: the test asserts each event with all of them held.
(Deadlines, sizes and the cap are tests/supervisor/test_connections.py's.)
"""

from __future__ import annotations

import os
import re
import signal
import uuid

from kdaemon.supervisor.control import request_status, socket_path
from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.produce import create_topic
from testkit.slow_clients import SlowClients, tcp, unix

HTTP_PREFIX = b"GET /metrics HTTP/1.1\r\nHost: kdaemon\r\nX-Slow: "
CONTROL_PREFIX = b'{"request": "status"'


def test_slow_and_idle_clients_of_both_endpoints_hold_nothing(broker, tmp_path):
    topic, group = f"slow-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    config = daemon_config(tmp_path, broker.bootstrap, topic, group, sink="null", endpoint_request_timeout_s=600.0)
    state_dir = config["daemon"]["state_dir"]
    host, _, port = config["daemon"]["metrics_addr"].rpartition(":")
    with Daemon(tmp_path, config) as d:
        d.wait_log(r"started worker 1 \(pid \d+\)", 30)
        d.wait_log(r"control socket .* \(kdaemon status\)", 30)
        with SlowClients(tcp(host, int(port)), HTTP_PREFIX) as http, \
                SlowClients(unix(socket_path(state_dir)), CONTROL_PREFIX, filler=b" ") as control:
            slow = (http, control)

            def all_held() -> bool:
                return all(s.held_by(d.pid) == len(s.all) for s in slow)

            def still_connected(when: str) -> None:
                assert [s.held() for s in slow] == [len(s.all) for s in slow], \
                    f"{when}: slow clients were closed or answered\n{d.log_tail()}"

            wait_for(all_held, 30, "the supervisor holding 50 clients on each endpoint", d.log_tail)

            page = d.metrics()
            assert any(name == "kdaemon_build_info" for name, _ in page), sorted(page)[:20]
            still_connected("after a scrape")

            status = request_status(state_dir)
            assert status.pid == d.pid and [w.index for w in status.workers] == [0, 1], status
            still_connected("after kdaemon status")

            victim = d.workers()[1]
            mark = len(d.log())
            os.kill(victim, signal.SIGKILL)
            replaced = d.wait_log(r"started worker 1 \(pid (\d+)\)", 30, after=mark)
            assert int(replaced[1]) != victim
            still_connected("after the replacement started")

            assert all_held(), "the supervisor let go of clients"
            d.signal(signal.SIGTERM)
            assert d.wait_exit(config["daemon"]["shutdown_timeout_s"] + 5) == 0, d.log_tail()
        log = d.log()
    assert not re.search(r"(metrics endpoint|control socket): closed ", log), log
