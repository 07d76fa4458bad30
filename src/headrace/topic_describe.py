"""``headrace topics describe`` over headrace's wire client (issue 26 defect 3).

During a failover -- the moment an operator runs it -- the AdminClient answered in 15-30 s,
could exit 3 with two brokers up, printed -1001 for a dead leader's partitions and spun in
librdkafka's reconnect loop. Here every answer comes from the brokers that are up, each
bounded:

* Metadata (v12, no topic auto-created) from the first bootstrap address that answers;
* at once, one thread per broker in that metadata: ListOffsets for the partitions it leads
  and DescribeLogDirs for its sizes, each broker bounded by ``BROKER_TIMEOUT_S``;
* DescribeConfigs of the topics from the broker that gave the metadata.

A partition without a leader shows ``Leader: none`` and an ``(offline)`` note (Kafka's
kafka-topics.sh prints ``Leader: none``); offsets a leader did not give are ``-``; each broker
that did not answer is one line on stderr. The pure parts (:func:`describe_doc`,
:func:`describe_lines`) are what the fast tests check.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from headrace.admin_wire import AdminConnection, SecurityError, list_offsets, partition_sizes

BROKER_TIMEOUT_S = 2.0  # one broker's connect and each of its answers
METADATA_VERSION = 12
DESCRIBE_CONFIGS_VERSION = 4
DEFAULT_CONFIG = 5  # DescribeConfigs' config_source for a value nobody set
UNKNOWN_TOPIC_OR_PARTITION = 3
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


class DescribeError(Exception):
    """Why the command cannot answer at all; ``code`` is its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class BrokerReply:
    offsets: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    sizes: dict[tuple[str, int], int] = field(default_factory=dict)
    error: str | None = None  # why this broker did not answer


def _metadata(addresses: list[tuple[str, int]], names: list[str] | None,
              config: dict[str, str], timeout_s: float) -> tuple[Any, AdminConnection]:
    """Metadata from the first address that answers, and the connection it came on."""
    reasons = []
    for host, port in addresses:
        try:
            conn = AdminConnection(host, port, timeout_s, config)
        except SecurityError as e:
            raise DescribeError(str(e), 4) from None
        except OSError as e:
            reasons.append(f"{host}:{port} ({e.strerror or e or 'timed out'})")
            continue
        try:
            md = conn.request(3, METADATA_VERSION, {
                "topics": None if names is None else [{"name": n, "topic_id": None}
                                                      for n in names],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False})
        except (OSError, ConnectionError, ValueError, EOFError) as e:
            conn.close()
            reasons.append(f"{host}:{port} ({e or type(e).__name__})")
            continue
        return md, conn
    raise DescribeError("cannot reach a broker at " + ", ".join(reasons), 3)


def _ask_broker(host: str, port: int, broker_id: int, led: list[tuple[str, int]],
                parts: dict[str, list[int]], config: dict[str, str]) -> BrokerReply:
    reply = BrokerReply()
    conn = AdminConnection(host, port, BROKER_TIMEOUT_S, config)
    try:
        if led:
            reply.offsets = list_offsets(conn, led)
        if parts:
            reply.sizes.update(partition_sizes(conn, parts))
    finally:
        conn.close()
    return reply


def _ask_brokers(brokers: dict[int, tuple[str, int]], led: dict[int, list[tuple[str, int]]],
                 parts: dict[str, list[int]], config: dict[str, str]) -> dict[int, BrokerReply]:
    """Every broker at once; one that has not answered in time is left behind (its
    thread ends by its socket timeout) with a reason."""
    if not brokers:
        return {}
    pool = ThreadPoolExecutor(len(brokers), thread_name_prefix="headrace-describe")
    futs = {bid: pool.submit(_ask_broker, host, port, bid, led.get(bid, []), parts, config)
            for bid, (host, port) in brokers.items()}
    deadline = BROKER_TIMEOUT_S * 4 + 0.5
    done, _ = wait_futures(futs.values(), timeout=deadline)
    pool.shutdown(wait=False)
    out: dict[int, BrokerReply] = {}
    for bid, fut in futs.items():
        if fut not in done:
            out[bid] = BrokerReply(error=f"no answer within {deadline:.0f} s")
            continue
        try:
            out[bid] = fut.result()
        except SecurityError as e:
            out[bid] = BrokerReply(error=f"authentication failed: {e}")
        except Exception as e:  # refused, reset, timed out, bytes we cannot read
            out[bid] = BrokerReply(error=getattr(e, "strerror", None) or str(e)
                                   or type(e).__name__)
    return out


def _configs(conn: AdminConnection, names: list[str]) -> dict[str, dict[str, str]]:
    """Each topic's values that are not defaults (as librdkafka's ``is_default``); a topic
    whose configs the broker refused or did not give has none."""
    if not names:
        return {}
    try:
        resp = conn.request(32, DESCRIBE_CONFIGS_VERSION, {
            "resources": [{"resource_type": 2, "resource_name": n, "configuration_keys": None}
                          for n in names],
            "include_synonyms": False, "include_documentation": False})
    except (OSError, ConnectionError, ValueError, EOFError):
        return {}
    out: dict[str, dict[str, str]] = {}
    for r in resp.results:
        if r.error_code != 0:
            continue
        out[str(r.resource_name)] = {
            str(c.name): "" if c.value is None else str(c.value)
            for c in sorted(r.configs, key=lambda c: str(c.name))
            if int(c.config_source) != DEFAULT_CONFIG}
    return out


def describe(addresses: list[tuple[str, int]], names: list[str] | None,
             config: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The topics' documents and one note per broker that did not answer. ``names``
    None: every topic. Raises DescribeError (an unknown topic: code 1)."""
    md, conn = _metadata(addresses, names, config, BROKER_TIMEOUT_S + 1)
    try:
        brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in md.brokers}
        topics = sorted(md.topics, key=lambda t: str(t.name))
        for t in topics:
            if t.error_code == UNKNOWN_TOPIC_OR_PARTITION:
                raise DescribeError(f"topic '{t.name}' does not exist", 1)
        topics = [t for t in topics if t.error_code == 0]
        led: dict[int, list[tuple[str, int]]] = {}
        parts: dict[str, list[int]] = {}
        for t in topics:
            for p in t.partitions:
                parts.setdefault(str(t.name), []).append(int(p.partition_index))
                if int(p.leader_id) >= 0:
                    led.setdefault(int(p.leader_id), []).append(
                        (str(t.name), int(p.partition_index)))
        replies = _ask_brokers(brokers, led, parts, config)
        configs = _configs(conn, [str(t.name) for t in topics])
    finally:
        conn.close()
    docs = describe_doc(topics, brokers, replies, configs)
    notes = [f"broker {bid} ({brokers[bid][0]}:{brokers[bid][1]}) did not answer: "
             f"{reply.error}; its partitions' offsets and sizes are not shown"
             for bid, reply in sorted(replies.items()) if reply.error is not None]
    return docs, notes


def describe_doc(topics: list[Any], brokers: dict[int, tuple[str, int]],
                 replies: dict[int, BrokerReply], configs: dict[str, dict[str, str]]
                 ) -> list[dict[str, Any]]:
    """The JSON documents from Metadata's topics and what each broker answered: a
    partition's ``leader`` is null and ``offline`` true when it has no leader (or its
    leader is not among the live brokers); offsets and size null where its leader did
    not give them."""
    out = []
    for t in topics:
        name = str(t.name)
        partitions: list[dict[str, Any]] = []
        for p in sorted(t.partitions, key=lambda p: int(p.partition_index)):
            index, leader = int(p.partition_index), int(p.leader_id)
            reply = replies.get(leader)
            start, end = (reply.offsets.get((name, index), (None, None)) if reply
                          else (None, None))
            partitions.append({
                "partition": index,
                "leader": leader if leader >= 0 else None,
                "offline": leader < 0 or leader not in brokers,
                "replicas": [int(n) for n in p.replica_nodes],
                "isr": [int(n) for n in p.isr_nodes],
                "offline_replicas": [int(n) for n in p.offline_replicas],
                "log_start_offset": start, "log_end_offset": end,
                "size_bytes": reply.sizes.get((name, index)) if reply else None})
        out.append({"name": name, "internal": bool(t.is_internal) or name in INTERNAL_TOPICS,
                    "partition_count": len(partitions),
                    "replication_factor": len(partitions[0]["replicas"]) if partitions else 0,
                    "configs": configs.get(name, {}), "partitions": partitions})
    return out


def _show(value: object) -> str:
    return "-" if value is None else str(value)


def describe_lines(docs: list[dict[str, Any]]) -> list[str]:
    """kafka-topics.sh --describe's layout, with offsets and size; a partition without a
    live leader: ``Leader: none`` (or the id of its unreachable leader) and ``(offline)``."""
    lines = []
    for t in docs:
        configs = ",".join(f"{k}={v}" for k, v in t["configs"].items())
        lines.append(f"Topic: {t['name']}\tPartitionCount: {t['partition_count']}\t"
                     f"ReplicationFactor: {t['replication_factor']}\tConfigs: {configs}")
        for p in t["partitions"]:
            leader = "none" if p["leader"] is None else str(p["leader"])
            line = (f"\tTopic: {t['name']}\tPartition: {p['partition']}\t"
                    f"Leader: {leader}\t"
                    f"Replicas: {','.join(map(str, p['replicas']))}\t"
                    f"Isr: {','.join(map(str, p['isr']))}\t"
                    f"LogStartOffset: {_show(p['log_start_offset'])}\t"
                    f"LogEndOffset: {_show(p['log_end_offset'])}\t"
                    f"Size: {_show(p['size_bytes'])}")
            if p["offline"]:
                line += "\t(offline)"
            lines.append(line)
    return lines
