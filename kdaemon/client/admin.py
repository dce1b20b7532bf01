"""Topic creation: ``create_topics`` sends CreateTopics (key 19) and waits until the new topics
are in the cluster's metadata, for ``kdaemon demo``'s sample topic and a Kafka DLQ whose table
asks for its topic (``create_topic = true``).

Where it goes: any broker.  A KRaft broker forwards the request to the active controller itself
(Java's admin client sends it to a random broker there too), so no controller is looked up; the
least loaded node is asked, as ``group_configs.py`` does, on a short-lived network client.

What an answer means, per topic (the request has no top-level error):

* NONE: created.  TOPIC_ALREADY_EXISTS: ``exist_ok`` says whether that is what the caller wants
  (``created=False`` in the result) or a refusal.  After an answer that left it open whether the
  topic was created (REQUEST_TIMED_OUT: the controller may have gone on), the retry's
  TOPIC_ALREADY_EXISTS counts as created, since most likely it was this call's own creation.
* A retriable code (NOT_CONTROLLER while the controller moves, REQUEST_TIMED_OUT,
  THROTTLING_QUOTA_EXCEEDED ...): that topic is asked again after ``retry_backoff_ms`` until the
  deadline, then ``TopicCreateUnavailable`` (transient).
* Anything else is a ``TopicCreateRefused`` (permanent) naming the topic, the code, the
  broker's own message and what to change: INVALID_REPLICATION_FACTOR (more replicas than
  brokers), INVALID_PARTITIONS, POLICY_VIOLATION (the cluster's create-topic policy),
  TOPIC_AUTHORIZATION_FAILED / CLUSTER_AUTHORIZATION_FAILED (no CREATE ACL), INVALID_CONFIG,
  INVALID_TOPIC_EXCEPTION (a name Kafka does not accept).  Topics of the same call that were
  created stay created: Kafka decides per topic.

Why wait for the metadata: the controller answers once the topic is in its log, before every
broker has applied it, and a producer whose first Metadata answer says "no such topic" stops for
good (``errors.missing_topic``).  So ``create_topics`` returns only once a broker lists every
partition of each topic (``wait=False`` skips that).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from ..protocol.apis import CREATE_TOPICS
from ..protocol.errors import BrokerError, Errors, UnsupportedVersionError, error_code
from ..protocol.primitives import ZERO_UUID
from ..protocol.schema import Api
from .config import ConsumerConfig
from .errors import KafkaClientError, KafkaTimeoutError, RefusedError
from .lookup import topic_partitions
from .network import NetworkClient

__all__ = ["NewTopic", "CreatedTopic", "TopicCreateRefused", "TopicCreateUnavailable", "create_topics"]

DEFAULT = -1   # partitions / replication factor: the broker's num.partitions / default.replication.factor

_KAFKA_TOPICS = "kafka-topics --bootstrap-server {servers} --describe --topic {topic}"
_ACL = ("grant the principal CREATE on the topic (kafka-acls --bootstrap-server {servers} --add "
        "--allow-principal User:<name> --operation Create --topic {topic}), or have an operator create it")
# What an operator changes when the broker refuses a topic with one of these codes.
_FIXES = {
    Errors.TOPIC_ALREADY_EXISTS: "it exists already: use it as it is, or delete it first "
                                 "(see it with: " + _KAFKA_TOPICS + ")",
    Errors.INVALID_REPLICATION_FACTOR: "ask for at most as many replicas as the cluster has brokers, "
                                       "or -1 for the broker's default.replication.factor",
    Errors.INVALID_PARTITIONS: "ask for at least 1 partition, or -1 for the broker's num.partitions",
    Errors.INVALID_REPLICA_ASSIGNMENT: "assign each partition to brokers the cluster has, as many for each",
    Errors.POLICY_VIOLATION: "the cluster's create-topic policy (create.topic.policy.class.name) refuses it: "
                             "create the topic as the broker's message says the policy allows, or have an "
                             "operator create it",
    Errors.TOPIC_AUTHORIZATION_FAILED: _ACL,
    Errors.CLUSTER_AUTHORIZATION_FAILED: _ACL,
    Errors.INVALID_CONFIG: "correct the topic config the broker's message names",
    Errors.INVALID_TOPIC_EXCEPTION: "name the topic with at most 249 of the characters a-z A-Z 0-9 . _ - "
                                    "(not '.' or '..')",
    Errors.UNSUPPORTED_VERSION: "the broker offers no CreateTopics version kdaemon speaks (v2-v7, Kafka 1.0 "
                                "or later); create the topic with the cluster's own tools",
}


@dataclass(frozen=True)
class NewTopic:
    """A topic to create: ``partitions`` and ``replication_factor`` -1 take the broker's
    defaults; ``configs`` are topic configs (``retention.ms`` ...)."""

    name: str
    partitions: int = DEFAULT
    replication_factor: int = DEFAULT
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CreatedTopic:
    """What ``create_topics`` did for one topic: ``created`` False when it existed already
    (``exist_ok``).  ``partitions`` and ``replication_factor`` are what the broker says the new
    topic got (-1: it did not say, an existing topic or a version before v5); ``topic_id`` None
    unless the broker said (v7+)."""

    name: str
    created: bool
    partitions: int = DEFAULT
    replication_factor: int = DEFAULT
    topic_id: uuid.UUID | None = None


class TopicCreateRefused(RefusedError):
    """The broker refused to create a topic for good.  ``topic`` and ``code`` are the first
    refusal's, ``broker_message`` its words ("" if none), ``fix`` what to change;
    ``refusals`` maps every refused topic to (code, broker message)."""

    def __init__(self, refusals: Mapping[str, tuple[int, str]], fix: str) -> None:
        parts = [f"topic {name}: {error_code(code).name} ({code})" + (f": {message}" if message else "")
                 for name, (code, message) in refusals.items()]
        super().__init__("the cluster refuses to create " + "; ".join(parts),
                         topic=next(iter(refusals)), code=next(iter(refusals.values()))[0], fix=fix)
        self.refusals = dict(refusals)
        self.broker_message = next(iter(refusals.values()))[1]


class TopicCreateUnavailable(KafkaClientError):
    """No final answer in time (no broker answered, only retriable errors, or the new topic not
    yet in a broker's metadata): try again later; with ``exist_ok`` that is always safe.
    ``code`` is the last retriable error code answered (None: none)."""

    retriable = True

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def create_topics(config: ConsumerConfig, topics: Iterable[NewTopic], *, exist_ok: bool = False,
                  validate_only: bool = False, wait: bool = True,
                  timeout_ms: int | None = None) -> dict[str, CreatedTopic]:
    """Create ``topics``; see the module docstring for what each answer means.  ``exist_ok``:
    a topic that exists already is fine (as it is: its partitions and configs are not checked).
    ``validate_only``: the broker checks and creates nothing.  ``timeout_ms`` (default
    ``default_api_timeout_ms``) bounds it all, the wait for the metadata included.  Returns
    name -> ``CreatedTopic``; raises ``TopicCreateRefused``, ``TopicCreateUnavailable`` or
    ``AuthenticationError``."""
    wanted = {t.name: t for t in topics}
    if not wanted:
        return {}
    budget_ms = config.default_api_timeout_ms if timeout_ms is None else timeout_ms
    deadline = time.monotonic() + budget_ms / 1000
    done: dict[str, CreatedTopic] = {}
    refused: dict[str, tuple[int, str]] = {}
    maybe_created: set[str] = set()
    last_code: int | None = None
    net = NetworkClient(config)
    try:
        pending = dict(wanted)
        while pending:
            answer = _ask(net, config, list(pending.values()), validate_only, deadline)
            if answer is not None:
                for r in answer["topics"]:
                    name, code = r["name"], r["error_code"]
                    if name not in pending:
                        continue
                    if code == Errors.NONE:
                        done[name] = _created(r)
                    elif code == Errors.TOPIC_ALREADY_EXISTS and name in maybe_created:
                        done[name] = CreatedTopic(name, True)
                    elif code == Errors.TOPIC_ALREADY_EXISTS and exist_ok:
                        done[name] = CreatedTopic(name, False)
                    elif error_code(code).retriable:
                        last_code = code
                        if code == Errors.REQUEST_TIMED_OUT:
                            maybe_created.add(name)
                        continue
                    else:
                        refused[name] = (code, r["error_message"] or "")
                    del pending[name]
                if not pending:
                    break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = (f"last error {error_code(last_code).name}" if last_code is not None else
                        f"last connection error: {net.last_connection_error() or 'none'}")
                raise TopicCreateUnavailable(
                    f"topics {', '.join(sorted(pending))}: no broker of {','.join(config.bootstrap_servers)} "
                    f"answered CreateTopics for good within {budget_ms} ms ({last})", last_code)
            net.poll(min(config.retry_backoff_ms / 1000, remaining))
    finally:
        net.close()
    if refused:
        first, (code, _) = next(iter(refused.items()))
        raise TopicCreateRefused(refused, _fix(code, config, first))
    if wait and not validate_only:
        _wait_until_listed(config, wanted, done, deadline, budget_ms)
    return done


def _ask(net: NetworkClient, config: ConsumerConfig, topics: list[NewTopic], validate_only: bool,
         deadline: float) -> dict | None:
    """One CreateTopics exchange (``ask_least_loaded``): its answer, or None to ask again."""
    remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
    body = {"topics": [{"name": t.name, "num_partitions": t.partitions, "replication_factor": t.replication_factor,
                        "assignments": [], "configs": [{"name": k, "value": v} for k, v in t.configs.items()]}
                       for t in topics],
            # How long the controller may take; it answers REQUEST_TIMED_OUT after that.
            "timeout_ms": remaining_ms, "validate_only": validate_only}

    def refuse(code: int, message: str):
        raise TopicCreateRefused({t.name: (code, message) for t in topics}, _fix(code, config, topics[0].name))
    return ask_least_loaded(net, CREATE_TOPICS, body, deadline, refuse)


def ask_least_loaded(net: NetworkClient, api: Api, body: dict, deadline: float,
                     refuse: Callable[[int, str], NoReturn]) -> dict | None:
    """One request to the least loaded broker, waited for until ``deadline``: its answer, or
    None when there was none (no broker ready, a lost connection, a retriable failure) and the
    caller should wait ``retry_backoff_ms`` and ask again.  A request refused for good (an
    unsupported version, a non-retriable error of the request itself) is handed to ``refuse``
    (error code, message), which raises; a failed authentication raises ``AuthenticationError``.
    The admin requests (CreateTopics here, the group configs' in group_configs.py) share it."""
    node = net.least_loaded_node()
    if node is not None:
        fut = net.send(node, api, body)
        net.poll(max(0.0, deadline - time.monotonic()), until=lambda: fut.done)
        if fut.done and not fut.failed:
            return fut.value()[1]
        if fut.done and isinstance(fut.exception, (UnsupportedVersionError, BrokerError)):
            exc = fut.exception
            code = exc.code if isinstance(exc, BrokerError) else Errors.UNSUPPORTED_VERSION
            if code == Errors.UNSUPPORTED_VERSION or not error_code(code).retriable:
                refuse(code, str(exc))
    error = net.auth_error()
    if error is not None:
        raise error   # permanent: AuthenticationError
    return None


def _created(r: dict) -> CreatedTopic:
    topic_id = r.get("topic_id")
    return CreatedTopic(r["name"], True, r.get("num_partitions", DEFAULT), r.get("replication_factor", DEFAULT),
                        None if topic_id in (None, ZERO_UUID) else topic_id)


def _wait_until_listed(config: ConsumerConfig, wanted: Mapping[str, NewTopic], done: Mapping[str, CreatedTopic],
                       deadline: float, budget_ms: int) -> None:
    """Until a broker's Metadata lists every partition of each topic (the number asked for, or
    the broker's own count for -1 or a topic that existed)."""
    def expected(name: str) -> int:
        asked = wanted[name].partitions if done[name].created else DEFAULT
        return asked if asked > 0 else max(done[name].partitions, 1)

    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        seen: dict[str, set[int] | None] = {}
        if remaining_ms > 0:
            try:
                seen = topic_partitions(config, list(done), timeout_ms=remaining_ms)
            except KafkaTimeoutError:
                pass
        late = sorted(n for n in done if seen.get(n) is None or len(seen[n] or ()) < expected(n))
        if not late:
            return
        if time.monotonic() >= deadline:
            raise TopicCreateUnavailable(f"topics {', '.join(late)} were created but no broker listed all their "
                                         f"partitions within {budget_ms} ms; ask again (exist_ok) to wait more")
        time.sleep(min(config.retry_backoff_ms / 1000, max(0.0, deadline - time.monotonic())))


def _fix(code: int, config: ConsumerConfig, topic: str) -> str:
    fix = _FIXES.get(code, "see the broker's message and log")
    return fix.format(servers=",".join(config.bootstrap_servers), topic=topic)
