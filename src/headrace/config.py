"""Broker and topic configuration: one table of definitions, Kafka's names and defaults.

Topic-level configs (``retention.ms``) take their default from a broker-level config
(``log.retention.ms``), exactly as Kafka does; a topic stores only its overrides and the
effective value is resolved against the broker's config. Values are parsed and validated
here, so a bad value anywhere (config file, flag, CreateTopics, IncrementalAlterConfigs)
gets the same clear ``ConfigError`` (mapped to INVALID_CONFIG by handlers).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

LONG_MAX = 9_223_372_036_854_775_807
INT_MAX = 2_147_483_647


class ConfigError(ValueError):
    """A configuration value (or name) is invalid. The message says which and why."""

    def __init__(self, name: str, message: str, *, value: Any = None,
                 reason: str | None = None, kafka: str | None = None) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        # the same error in Kafka's words (``ConfigException(name, value, reason)``), for
        # the error messages of the admin APIs
        self.kafka_message = kafka if kafka is not None else (
            f"Invalid value {value} for configuration {name}: {reason}" if reason is not None
            else f"Invalid value {value} for configuration {name}")


# --------------------------------------------------------------------------- parsing


def _parse_int(bits: int) -> Callable[[str, Any], int]:
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    kafka = f"Not a number of type {'INT' if bits == 32 else 'LONG'}"

    def parse(name: str, raw: Any) -> int:
        if isinstance(raw, bool):
            raise ConfigError(name, f"expected an integer, got {raw!r}", value=raw,
                              reason=kafka)
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ConfigError(name, f"expected an integer, got {raw!r}", value=raw,
                              reason=kafka) from None
        if not lo <= value <= hi:
            raise ConfigError(name, f"{value} does not fit in a {bits}-bit integer",
                              value=raw, reason=kafka)
        return value

    return parse


def _parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ConfigError(name, f"expected true or false, got {raw!r}", value=raw,
                      reason="Expected value to be either true or false")


def _parse_str(name: str, raw: Any) -> str:
    return str(raw).strip()


def _parse_list(name: str, raw: Any) -> str:
    if isinstance(raw, (list, tuple)):
        items = [str(x).strip() for x in raw]
    else:
        items = [x.strip() for x in str(raw).split(",")]
    return ",".join(x for x in items if x)


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    kind: str  # "int" | "long" | "bool" | "string" | "list"
    default: Any
    doc: str
    at_least: int | None = None
    choices: tuple[str, ...] | None = None
    broker_name: str | None = None  # for topic configs: the broker config giving the default
    at_most: int | None = None

    def parse(self, raw: Any) -> Any:
        parser = {
            "int": _parse_int(32),
            "long": _parse_int(64),
            "bool": _parse_bool,
            "string": _parse_str,
            "list": _parse_list,
            "version": _parse_message_format_version,
        }[self.kind]
        value: Any = parser(self.name, raw)
        if self.at_least is not None and value < self.at_least:
            raise ConfigError(self.name, f"value {value} must be at least {self.at_least}",
                              value=value, reason=f"Value must be at least {self.at_least}")
        if self.at_most is not None and value > self.at_most:  # Kafka's Range.between
            raise ConfigError(self.name, f"value {value} must be at most {self.at_most}",
                              value=value, reason=f"Value must be no more than {self.at_most}")
        if self.kind == "list" and not value:
            raise ConfigError(self.name, "must not be empty", value=raw,
                              reason="Value must not be empty")
        if self.choices is not None:
            values = value.split(",") if self.kind == "list" else [value]
            for v in values:
                if v not in self.choices:
                    # Kafka's ValidString/ValidList, its choices in its order
                    raise ConfigError(
                        self.name, f"{v!r} is not one of {', '.join(self.choices)}", value=v,
                        reason="String must be one of: " + ", ".join(
                            sorted(self.choices) if self.kind == "list" else self.choices))
        return value

    def to_string(self, value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


def _defs(*defs: ConfigDef) -> dict[str, ConfigDef]:
    return {d.name: d for d in defs}


DAY_MS = 86_400_000

# Broker-level configs (server.properties names).
BROKER_CONFIGS = _defs(
    ConfigDef("node.id", "int", 0, "This broker's id.", at_least=0),
    ConfigDef("host", "string", "127.0.0.1", "Address to listen on."),
    ConfigDef("port", "int", 9092, "Port to listen on (0: any free port).", at_least=0),
    ConfigDef("advertised.host", "string", "", "Host given to clients (default: host)."),
    ConfigDef("advertised.port", "int", 0, "Port given to clients (0: the bound port).",
              at_least=0),
    ConfigDef("log.dirs", "string", "./data", "Data directory."),
    ConfigDef("num.partitions", "int", 1, "Partitions of auto-created topics.", at_least=1),
    ConfigDef("default.replication.factor", "int", 1, "Replication factor of auto-created "
              "topics.", at_least=1),
    ConfigDef("auto.create.topics.enable", "bool", True,
              "Create a topic when a client asks for its metadata or produces to it."),
    ConfigDef("delete.topic.enable", "bool", True, "Allow DeleteTopics."),
    ConfigDef("message.max.bytes", "int", 1_048_588,
              "Largest record batch the broker accepts (topic: max.message.bytes).",
              at_least=0),
    ConfigDef("socket.request.max.bytes", "int", 104_857_600,
              "Largest request frame; a bigger one closes the connection.", at_least=1),
    ConfigDef("log.segment.bytes", "int", 1_073_741_824, "Segment size before a roll.",
              at_least=14),
    ConfigDef("log.roll.ms", "long", 7 * DAY_MS, "Segment age before a roll.", at_least=1),
    ConfigDef("log.retention.ms", "long", 7 * DAY_MS,
              "Delete segments older than this (-1: never).", at_least=-1),
    ConfigDef("log.retention.bytes", "long", -1,
              "Delete old segments while a partition is larger (-1: no limit).", at_least=-1),
    ConfigDef("log.retention.check.interval.ms", "long", 300_000,
              "How often retention runs.", at_least=1),
    ConfigDef("log.index.interval.bytes", "int", 4096,
              "Bytes between offset/time index entries.", at_least=0),
    ConfigDef("log.index.size.max.bytes", "int", 10_485_760,
              "Maximum size of a segment's index file.", at_least=4),
    ConfigDef("log.flush.interval.messages", "long", LONG_MAX,
              "fsync after this many messages (default: rely on replication).", at_least=1),
    ConfigDef("log.flush.interval.ms", "long", LONG_MAX,
              "fsync after this long (default: rely on replication).", at_least=0),
    ConfigDef("log.cleanup.policy", "list", "delete", "delete and/or compact.",
              choices=("delete", "compact")),
    ConfigDef("log.cleaner.delete.retention.ms", "long", DAY_MS,
              "How long tombstones are kept by compaction.", at_least=0),
    ConfigDef("log.message.timestamp.type", "string", "CreateTime",
              "CreateTime or LogAppendTime.", choices=("CreateTime", "LogAppendTime")),
    ConfigDef("compression.type", "string", "producer", "Keep the producer's codec.",
              choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    ConfigDef("min.insync.replicas", "int", 1, "acks=all needs this many in-sync replicas.",
              at_least=1),
    ConfigDef("unclean.leader.election.enable", "bool", False,
              "Allow an out-of-sync replica to become leader."),
    ConfigDef("offsets.topic.num.partitions", "int", 50, "Partitions of __consumer_offsets.",
              at_least=1),
    ConfigDef("group.initial.rebalance.delay.ms", "int", 3000,
              "Delay of a new group's first rebalance.", at_least=0),
    ConfigDef("group.min.session.timeout.ms", "int", 6000,
              "Smallest session.timeout.ms a group member may ask for.", at_least=0),
    ConfigDef("group.max.session.timeout.ms", "int", 1_800_000,
              "Largest session.timeout.ms a group member may ask for.", at_least=0),
    ConfigDef("group.consumer.assignors", "list", "uniform,range",
              "Server-side assignors of KIP-848 groups; the first is the default.",
              choices=("uniform", "range")),
    ConfigDef("group.consumer.session.timeout.ms", "int", 45_000,
              "Session timeout of KIP-848 group members.", at_least=1),
    ConfigDef("group.consumer.heartbeat.interval.ms", "int", 5_000,
              "Heartbeat interval given to KIP-848 group members.", at_least=1),
    ConfigDef("group.max.size", "int", INT_MAX, "Most members in one classic group.",
              at_least=1),
    # issue 27: the bounds of the per-group configs (IncrementalAlterConfigs on GROUP) and
    # the defaults of those with no headrace config yet (share and streams groups)
    ConfigDef("group.consumer.min.session.timeout.ms", "int", 45_000,
              "Smallest consumer.session.timeout.ms a group config may set.", at_least=1),
    ConfigDef("group.consumer.max.session.timeout.ms", "int", 60_000,
              "Largest consumer.session.timeout.ms a group config may set.", at_least=1),
    ConfigDef("group.consumer.min.heartbeat.interval.ms", "int", 5_000,
              "Smallest consumer.heartbeat.interval.ms a group config may set.", at_least=1),
    ConfigDef("group.consumer.max.heartbeat.interval.ms", "int", 15_000,
              "Largest consumer.heartbeat.interval.ms a group config may set.", at_least=1),
    ConfigDef("group.share.session.timeout.ms", "int", 45_000,
              "Session timeout of share group members (default of share.session.timeout.ms).",
              at_least=1),
    ConfigDef("group.share.min.session.timeout.ms", "int", 45_000,
              "Smallest share.session.timeout.ms a group config may set.", at_least=1),
    ConfigDef("group.share.max.session.timeout.ms", "int", 60_000,
              "Largest share.session.timeout.ms a group config may set.", at_least=1),
    ConfigDef("group.share.heartbeat.interval.ms", "int", 5_000,
              "Heartbeat interval of share group members (default of "
              "share.heartbeat.interval.ms).", at_least=1),
    ConfigDef("group.share.min.heartbeat.interval.ms", "int", 5_000,
              "Smallest share.heartbeat.interval.ms a group config may set.", at_least=1),
    ConfigDef("group.share.max.heartbeat.interval.ms", "int", 15_000,
              "Largest share.heartbeat.interval.ms a group config may set.", at_least=1),
    # Kafka 4.2's ShareGroupConfig bounds (Range.between)
    ConfigDef("group.share.record.lock.duration.ms", "int", 30_000,
              "Acquisition lock of a share group's records (default of "
              "share.record.lock.duration.ms).", at_least=1000, at_most=3_600_000),
    ConfigDef("group.share.min.record.lock.duration.ms", "int", 15_000,
              "Smallest share.record.lock.duration.ms a group config may set.", at_least=1000,
              at_most=30_000),
    ConfigDef("group.share.max.record.lock.duration.ms", "int", 60_000,
              "Largest share.record.lock.duration.ms a group config may set.",
              at_least=30_000, at_most=3_600_000),
    # the rest of Kafka 4.2's share group broker configs (GroupCoordinatorConfig and
    # ShareGroupConfig); in 4.2 these have no group-level config
    ConfigDef("group.share.delivery.count.limit", "int", 5,
              "Most delivery attempts of a record to a share group (then it is archived).",
              at_least=2, at_most=10),
    ConfigDef("group.share.partition.max.record.locks", "int", 2000,
              "Most records a share-partition holds in flight (acquired or available "
              "again).", at_least=100, at_most=10_000),
    ConfigDef("group.share.max.share.sessions", "int", 2000,
              "Most share sessions one broker holds.", at_least=1),
    ConfigDef("group.share.max.size", "int", 200, "Most members in one share group.",
              at_least=1, at_most=1000),
    ConfigDef("group.share.assignors", "list", "simple",
              "The share groups' server-side assignor (Kafka's SimpleAssignor).",
              choices=("simple",)),
    ConfigDef("group.share.initialize.retry.interval.ms", "int", 30_000,
              "A share-partition whose state initialization has not answered for this long "
              "is asked for again (internal in Kafka).", at_least=1),
    ConfigDef("group.streams.session.timeout.ms", "int", 45_000,
              "Session timeout of streams group members (default of "
              "streams.session.timeout.ms).", at_least=1),
    ConfigDef("group.streams.min.session.timeout.ms", "int", 45_000,
              "Smallest streams.session.timeout.ms a group config may set.", at_least=1),
    ConfigDef("group.streams.max.session.timeout.ms", "int", 60_000,
              "Largest streams.session.timeout.ms a group config may set.", at_least=1),
    ConfigDef("group.streams.heartbeat.interval.ms", "int", 5_000,
              "Heartbeat interval of streams group members (default of "
              "streams.heartbeat.interval.ms).", at_least=1),
    ConfigDef("group.streams.min.heartbeat.interval.ms", "int", 5_000,
              "Smallest streams.heartbeat.interval.ms a group config may set.", at_least=1),
    ConfigDef("group.streams.max.heartbeat.interval.ms", "int", 15_000,
              "Largest streams.heartbeat.interval.ms a group config may set.", at_least=1),
    ConfigDef("group.streams.num.standby.replicas", "int", 0,
              "Standby replicas of a streams group's tasks (default of "
              "streams.num.standby.replicas).", at_least=0),
    ConfigDef("group.streams.max.standby.replicas", "int", 2,
              "Largest streams.num.standby.replicas a group config may set.", at_least=0),
    ConfigDef("group.streams.initial.rebalance.delay.ms", "int", 3_000,
              "Delay of a new streams group's first rebalance (default of "
              "streams.initial.rebalance.delay.ms).", at_least=0),
    ConfigDef("request.timeout.ms", "int", 30_000, "Upper bound of purgatory waits.",
              at_least=0),
    ConfigDef("cluster.id", "string", "", "Cluster id (default: generated once, persisted)."),
    # ---- resource bounds (R-NF-1): no client can exhaust memory, connections or files
    ConfigDef("queued.max.requests", "int", 500,
              "Requests received but not yet handled, across all connections (plus one per "
              "connection with none queued); past it connections stop being read.",
              at_least=1),
    ConfigDef("queued.max.request.bytes", "long", 268_435_456,
              "Memory pool for request frames being received or queued, shared by all "
              "connections (-1: no limit); a connection whose next frame does not fit waits.",
              at_least=-1),
    ConfigDef("fetch.max.bytes", "int", 57_671_680,
              "Largest Fetch response the broker builds (caps the request's max_bytes).",
              at_least=1024),
    ConfigDef("queued.max.unreceived.bytes.per.ip", "long", 33_554_432,
              "Bytes of queued.max.request.bytes one address may hold reserved for frames "
              "whose bytes have not all arrived (a size prefix reserves the whole frame); past "
              "it that address's next frames wait for its own bytes (-1: no cap).",
              at_least=-1),
    ConfigDef("request.receive.timeout.ms", "long", 30_000,
              "Close a connection whose frame in progress is not complete this long after it "
              "started arriving (time the broker is not reading it does not count).",
              at_least=1),
    ConfigDef("connections.max.idle.ms", "long", 600_000,
              "Close connections idle (or stuck mid-request) for this long.", at_least=1),
    ConfigDef("connections.first.request.timeout.ms", "long", 30_000,
              "Close a connection that has not completed a request (on a SASL listener: "
              "authenticated) within this long of opening.", at_least=1),
    ConfigDef("max.connections", "int", 10_000,
              "Most open client connections (the inter-broker listener, when there are "
              "several, is not refused by it: KIP-402).", at_least=1),
    ConfigDef("max.connections.per.ip", "int", 1000,
              "Most open connections from one address (a tenth of max.connections: one "
              "address cannot take every slot).", at_least=1),
    ConfigDef("max.connections.per.ip.overrides", "string", "",
              "Per-address exceptions to max.connections.per.ip: host:count,host:count."),
    # client quotas (issue 12): Kafka's sampled rates and KIP-612's connection creation rate
    ConfigDef("quota.window.num", "int", 11,
              "Samples kept in memory for client quotas.", at_least=1),
    ConfigDef("quota.window.size.seconds", "int", 1,
              "Time span of each client quota sample.", at_least=1),
    ConfigDef("max.connection.creation.rate", "int", INT_MAX,
              "Most new connections per second broker-wide; past it new connections are held "
              "unread for the throttle time (KIP-612).", at_least=0),
    ConfigDef("sasl.server.max.receive.size", "int", 524_288,
              "Largest request accepted before a connection has authenticated.", at_least=1),
    ConfigDef("max.broker.partitions", "int", 100_000,
              "Most partitions this broker hosts (KIP-578); CreateTopics and "
              "CreatePartitions past it are refused whole.", at_least=1),
    ConfigDef("log.message.timestamp.before.max.ms", "long", LONG_MAX,
              "Largest allowed age of a record's CreateTime at append (KIP-937).", at_least=0),
    ConfigDef("log.message.timestamp.after.max.ms", "long", 3_600_000,
              "Largest allowed lead of a record's CreateTime over the broker's clock "
              "(KIP-937; Kafka 4.0's default).", at_least=0),
    # ---- a replicated cluster on ZooKeeper (issue 9); `broker.id` is an alias of node.id
    ConfigDef("zookeeper.connect", "string", "",
              "ZooKeeper ensemble HOST:PORT[,HOST:PORT...][/chroot] of a cluster "
              "(empty: a single node with its metadata in the data dir)."),
    ConfigDef("zookeeper.session.timeout.ms", "int", 18_000,
              "ZooKeeper session timeout: a broker silent this long is declared dead.",
              at_least=1),
    ConfigDef("zookeeper.connection.timeout.ms", "int", 18_000,
              "How long a broker waits to connect to ZooKeeper at start.", at_least=1),
    ConfigDef("broker.rack", "string", "", "Rack of this broker (rack-aware assignment)."),
    ConfigDef("offsets.topic.replication.factor", "int", 3,
              "Replication factor of __consumer_offsets (capped by live brokers when it "
              "is created).", at_least=1),
    ConfigDef("transaction.state.log.num.partitions", "int", 50,
              "Partitions of __transaction_state.", at_least=1),
    ConfigDef("transaction.state.log.replication.factor", "int", 3,
              "Replication factor of __transaction_state (capped by live brokers when it "
              "is created).", at_least=1),
    ConfigDef("transaction.state.log.min.isr", "int", 2,
              "min.insync.replicas of __transaction_state (capped by its replication "
              "factor).", at_least=1),
    ConfigDef("transaction.state.log.segment.bytes", "int", 104_857_600,
              "segment.bytes of __transaction_state.", at_least=14),
    # ---- the share coordinator (KIP-932, issue 25): Kafka's ShareCoordinatorConfig
    ConfigDef("share.coordinator.state.topic.num.partitions", "int", 50,
              "Partitions of __share_group_state.", at_least=1),
    ConfigDef("share.coordinator.state.topic.replication.factor", "int", 3,
              "Replication factor of __share_group_state (capped by live brokers when it "
              "is created).", at_least=1),
    ConfigDef("share.coordinator.state.topic.min.isr", "int", 2,
              "min.insync.replicas of __share_group_state (capped by its replication "
              "factor).", at_least=1),
    ConfigDef("share.coordinator.state.topic.segment.bytes", "int", 104_857_600,
              "segment.bytes of __share_group_state.", at_least=14),
    ConfigDef("share.coordinator.snapshot.update.records.per.snapshot", "int", 500,
              "ShareUpdate records a share-partition's state takes before the next write "
              "is a whole ShareSnapshot.", at_least=0, at_most=500),
    ConfigDef("producer.id.expiration.ms", "int", 86_400_000,
              "A producer id with no batch in a partition for this long (and no open "
              "transaction there) is forgotten by that partition.", at_least=1),
    ConfigDef("producer.id.expiration.check.interval.ms", "int", 600_000,
              "How often partitions look for expired producer ids.", at_least=1),
    ConfigDef("transaction.max.timeout.ms", "int", 900_000,
              "The largest transaction.timeout.ms a producer may ask for.", at_least=1),
    ConfigDef("transactional.id.expiration.ms", "int", 604_800_000,
              "A transactional id idle this long (no transaction) is forgotten.", at_least=1),
    ConfigDef("transaction.partition.verification.enable", "bool", True,
              "Before a partition's leader appends the first batch of a producer's "
              "transaction, it asks the transaction coordinator whether the partition is "
              "in that producer's ongoing transaction, and refuses the batch if not "
              "(KIP-890): no transaction the coordinator does not know can pin the last "
              "stable offset."),
    ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10_000,
              "How often transactions past their timeout are looked for and aborted.",
              at_least=1),
    ConfigDef("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3_600_000,
              "How often expired transactional ids are looked for.", at_least=1),
    ConfigDef("replica.lag.time.max.ms", "long", 30_000,
              "A follower that has not caught up with the leader for this long leaves the "
              "ISR.", at_least=1),
    ConfigDef("num.replica.fetchers", "int", 1,
              "Fetcher connections per source broker.", at_least=1),
    ConfigDef("replica.fetch.max.bytes", "int", 1_048_576,
              "Bytes per partition a follower fetch asks for (the first batch goes whole).",
              at_least=0),
    ConfigDef("replica.fetch.response.max.bytes", "int", 10_485_760,
              "Bytes per follower fetch response.", at_least=0),
    ConfigDef("replica.fetch.wait.max.ms", "int", 500,
              "Long-poll time of follower fetches (below replica.lag.time.max.ms).",
              at_least=0),
    ConfigDef("replica.fetch.min.bytes", "int", 1, "min_bytes of follower fetches.",
              at_least=1),
    ConfigDef("replica.fetch.backoff.ms", "int", 1_000,
              "Pause after a follower fetch fails.", at_least=0),
    ConfigDef("replica.high.watermark.checkpoint.interval.ms", "long", 5_000,
              "How often high watermarks are written to replication-offset-checkpoint.",
              at_least=1),
    ConfigDef("auto.leader.rebalance.enable", "bool", True,
              "The controller moves leadership back to preferred replicas."),
    ConfigDef("leader.imbalance.check.interval.seconds", "long", 300,
              "How often the controller checks leader imbalance.", at_least=1),
    ConfigDef("leader.imbalance.per.broker.percentage", "int", 10,
              "Non-preferred leaders a broker may have (percent) before a rebalance.",
              at_least=0),
    ConfigDef("controlled.shutdown.enable", "bool", True,
              "On SIGTERM, ask the controller to move leadership away first."),
    ConfigDef("controlled.shutdown.max.retries", "int", 3,
              "Attempts of a controlled shutdown.", at_least=0),
    ConfigDef("controlled.shutdown.retry.backoff.ms", "long", 5_000,
              "Pause between controlled shutdown attempts.", at_least=0),
    # issue 13: the Prometheus endpoint (broker/metrics.py)
    ConfigDef("metrics.port", "int", 0, "Port of the Prometheus endpoint (/metrics, /health, "
              "/ready); 0: no endpoint.", at_least=0),
    ConfigDef("metrics.host", "string", "", "Address of the Prometheus endpoint "
              "(default: host)."),
)

# Kafka's older names accepted as aliases (ZooKeeper-mode server.properties).
BROKER_ALIASES = {"broker.id": "node.id"}

# ---- Kafka's listener configs (server.properties): the inter-broker listener's entry is
# translated into host/port and advertised.host/advertised.port (which win when given too,
# e.g. ``--port``); all are kept as given, and ``headrace.security.listeners`` builds every
# listener (protocol, TLS, SASL) from them and the ssl./sasl./listener.name. keys. A
# listener named in controller.listener.names (a KRaft controller's) is not served here.
DEFAULT_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
LISTENER_CONFIGS = _defs(
    ConfigDef("listeners", "string", "",
              "Kafka's NAME://HOST:PORT listener list (an empty host: every interface); "
              "the inter-broker listener's entry sets host and port."),
    ConfigDef("advertised.listeners", "string", "",
              "Kafka's advertised NAME://HOST:PORT list; the inter-broker listener's entry "
              "sets advertised.host and advertised.port."),
    ConfigDef("listener.security.protocol.map", "string", DEFAULT_PROTOCOL_MAP,
              "Listener name → security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, "
              "SASL_SSL)."),
    # ---- authorization (issue 12): Kafka's ACL authorizer, active when a class is named
    ConfigDef("authorizer.class.name", "string", "",
              "Kafka's authorizer class (kafka.security.authorizer.AclAuthorizer or "
              "org.apache.kafka.metadata.authorizer.StandardAuthorizer): ACLs are checked "
              "on every API; empty: no authorization (ACL APIs answer SECURITY_DISABLED).",
              choices=("", "kafka.security.authorizer.AclAuthorizer",
                       "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                       "kafka.security.auth.SimpleAclAuthorizer")),
    ConfigDef("super.users", "string", "",
              "Principals allowed everything, separated by semicolons (User:admin;User:ops)."),
    ConfigDef("allow.everyone.if.no.acl.found", "bool", False,
              "Allow an operation on a resource no ACL matches at all."),
    ConfigDef("controller.listener.names", "string", "",
              "Listeners of a KRaft controller: accepted, not served here."),
    ConfigDef("inter.broker.listener.name", "string", "",
              "The listener brokers reach each other on (default: the first listener, or "
              "the one security.inter.broker.protocol names)."),
    ConfigDef("security.inter.broker.protocol", "string", "",
              "The inter-broker listener by its protocol (when inter.broker.listener.name "
              "is not given)."),
    ConfigDef("sasl.mechanism.inter.broker.protocol", "string", "PLAIN",
              "SASL mechanism brokers authenticate to each other with."),
    ConfigDef("connection.failed.authentication.delay.ms", "int", 100,
              "How long a failed authentication's answer is held before it is sent and the "
              "connection closed (one guess per delay per connection).",
              at_least=0),
    ConfigDef("connections.max.reauth.ms", "long", 0,
              "KIP-368: a SASL session's lifetime; clients re-authenticate before it ends "
              "(0: never).", at_least=0),
)

# Kafka's time configs in coarser units: (config, unit in ms), finest first. Kafka's
# precedence: ms over minutes over hours; a negative value means no limit (-1).
TIME_UNIT_FORMS = {
    "log.retention.ms": (("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
    "log.roll.ms": (("log.roll.hours", 3_600_000),),
}

# Kafka broker configs accepted from a server.properties file with no effect here (thread
# pools, socket buffers, KRaft quorum, transaction log, metrics, ...): the broker starts
# and says once which of them it ignores. Anything else unknown is refused (a typo).
NO_EFFECT_CONFIGS = frozenset({
    "num.network.threads", "num.io.threads", "background.threads",
    "socket.send.buffer.bytes", "socket.receive.buffer.bytes", "socket.listen.backlog.size",
    "socket.connection.setup.timeout.ms", "socket.connection.setup.timeout.max.ms",
    "num.recovery.threads.per.data.dir", "num.replica.alter.log.dirs.threads",
    "process.roles", "controller.quorum.voters", "controller.quorum.bootstrap.servers",
    "controller.quorum.election.timeout.ms", "controller.quorum.fetch.timeout.ms",
    "metadata.log.dir", "metadata.log.segment.bytes", "metadata.max.retention.bytes",
    "inter.broker.protocol.version",
    "log.cleaner.enable", "log.cleaner.threads",
    "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.size", "log.cleaner.backoff.ms",
    "log.cleaner.min.cleanable.ratio", "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.io.buffer.load.factor", "log.preallocate", "log.segment.delete.delay.ms",
    "log.flush.scheduler.interval.ms", "log.flush.offset.checkpoint.interval.ms",
    "log.flush.start.offset.checkpoint.interval.ms", "log.roll.jitter.ms",
    "log.roll.jitter.hours", "replica.socket.timeout.ms", "replica.socket.receive.buffer.bytes",
    "offsets.retention.minutes", "offsets.retention.check.interval.ms",
    "offsets.topic.segment.bytes", "offsets.load.buffer.size", "offsets.commit.timeout.ms",
    "offsets.topic.compression.codec", "group.coordinator.rebalance.protocols",
    "group.coordinator.threads", "zookeeper.sync.time.ms", "zookeeper.max.in.flight.requests",
    "reserved.broker.max.id", "broker.id.generation.enable", "replication.quota.window.num",
"fetch.purgatory.purge.interval.requests",
    "producer.purgatory.purge.interval.requests",
    "delete.records.purgatory.purge.interval.requests",
    "max.incremental.fetch.session.cache.slots", "metric.reporters",
    "auto.include.jmx.reporter", "compression.gzip.level", "compression.lz4.level",
    "compression.zstd.level",
})
# ... and every key under these prefixes (metrics)
NO_EFFECT_PREFIXES = ("metrics.", "kafka.metrics.")
# TLS and SASL settings (global and per listener): read by headrace.security.listeners
SECURITY_PREFIXES = ("ssl.", "sasl.", "listener.name.")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_LISTENER = re.compile(r"^([A-Za-z0-9_]+)://(\[[0-9A-Fa-f:.]+\]|[^:/\[\]]*):(\d{1,5})$")


def _listeners(name: str, text: str) -> list[tuple[str, str, int]]:
    """``NAME://HOST:PORT,...`` → (NAME upper-cased, host without brackets, port)."""
    out: list[tuple[str, str, int]] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        m = _LISTENER.match(item)
        if m is None or int(m.group(3)) > 65_535:
            raise ConfigError(name, f"{item!r} is not NAME://HOST:PORT")
        if any(n == m.group(1).upper() for n, _, _ in out):
            raise ConfigError(name, f"listener name {m.group(1)} appears twice")
        out.append((m.group(1).upper(), m.group(2).strip("[]"), int(m.group(3))))
    return out


def _protocol_map(text: str) -> dict[str, str]:
    name = "listener.security.protocol.map"
    out: dict[str, str] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        listener, sep, protocol = item.partition(":")
        if not sep or not listener.strip() or protocol.strip().upper() not in SECURITY_PROTOCOLS:
            raise ConfigError(name, f"{item!r} is not LISTENER:PROTOCOL (a protocol is one "
                                    f"of {', '.join(SECURITY_PROTOCOLS)})")
        out[listener.strip().upper()] = protocol.strip().upper()
    return out


def _translate_kafka_forms(raw: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Kafka's server.properties forms → headrace's keys. Returns the mapping to validate
    and the warnings to log (one line each)."""
    out = {BROKER_ALIASES.get(k, k): v for k, v in raw.items()}
    notes: list[str] = []
    ignored = sorted(k for k in out if k not in BROKER_CONFIGS and k not in LISTENER_CONFIGS
                     and (k in NO_EFFECT_CONFIGS or k.startswith(NO_EFFECT_PREFIXES)))
    for k in ignored:
        del out[k]
    used = _security_keys_used(out)
    for k in [k for k in out if k.startswith(SECURITY_PREFIXES) and k not in BROKER_CONFIGS
              and k not in LISTENER_CONFIGS]:
        del out[k]  # kept in ``given``; validated when the listeners are built
        if not used(k):
            ignored.append(k)
    ignored.sort()
    notes += _deprecated_broker_configs(raw, out)
    # time units: the finest given wins
    for ms_name, forms in TIME_UNIT_FORMS.items():
        coarse = [(unit, _parse_int(32)(n, out.pop(n))) for n, unit in forms if n in out]
        if ms_name not in out and coarse:
            unit, value = coarse[0]
            out[ms_name] = -1 if value < 0 else value * unit
    # log.dir (Kafka's single-directory form) and several log.dirs
    single = out.pop("log.dir", None)
    if "log.dirs" not in out and single is not None:
        out["log.dirs"] = single
    if "log.dirs" in out:
        dirs = [d.strip() for d in str(out["log.dirs"]).split(",") if d.strip()]
        if not dirs:
            raise ConfigError("log.dirs", "must name a directory")
        if len(dirs) > 1:
            notes.append(f"log.dirs lists {len(dirs)} directories: {dirs[0]} holds the "
                         f"broker's state and new partitions; {', '.join(dirs[1:])} hold "
                         "the replicas moved there (AlterReplicaLogDirs)")
        out["log.dirs"] = dirs[0]
    ignored += _translate_listeners(out)
    if ignored:
        notes.insert(0, "accepted with no effect here: " + ", ".join(ignored))
    return out, tuple(notes)


def _deprecated_broker_configs(raw: Mapping[str, Any], out: dict[str, Any]) -> list[str]:
    """Kafka 3.9's deprecated broker configs (KafkaConfig's @deprecated), taken out of
    ``out``: ``log.message.format.version`` is validated and ignored with Kafka's warning
    (``createBrokerWarningMessage``); ``log.message.timestamp.difference.max.ms`` is the
    before and after limits where the file sets neither, as Kafka 3.9 reads it."""
    notes: list[str] = []
    fmt = out.pop("log.message.format.version", None)
    if fmt is not None:
        _parse_message_format_version("log.message.format.version", fmt)
        ibp = str(raw.get("inter.broker.protocol.version", INTER_BROKER_PROTOCOL_VERSION))
        notes.append(f"Broker configuration log.message.format.version with value {fmt} is "
                     f"ignored because the inter-broker protocol version `{ibp}` is greater "
                     "or equal than 3.0. This configuration is deprecated and it will be "
                     "removed in Apache Kafka 4.0.")
    name = "log.message.timestamp.difference.max.ms"
    difference = out.pop(name, None)
    if difference is not None:
        value = _parse_int(64)(name, difference)
        if value < 0:
            raise ConfigError(name, f"value {value} must be at least 0", value=value,
                              reason="Value must be at least 0")
        for limit in ("log.message.timestamp.before.max.ms",
                      "log.message.timestamp.after.max.ms"):
            out.setdefault(limit, value)
    return notes


def _security_keys_used(out: Mapping[str, Any]) -> Callable[[str], bool]:
    """Whether a TLS or SASL key applies to some served listener (ssl.* needs an SSL or
    SASL_SSL listener, sasl.* a SASL one, listener.name.<x>.* a served listener x)."""
    protocols = _protocol_map(str(out.get("listener.security.protocol.map",
                                          DEFAULT_PROTOCOL_MAP)))
    served = {n: protocols.get(n, "") for n, _, _ in
              _listeners("listeners", str(out.get("listeners", "")))} or {
                  "PLAINTEXT": "PLAINTEXT"}
    tls = {n for n, p in served.items() if p in ("SSL", "SASL_SSL")}
    sasl = {n for n, p in served.items() if p in ("SASL_PLAINTEXT", "SASL_SSL")}

    def used(key: str) -> bool:
        names = set(served)
        if key.startswith("listener.name."):
            name, _, key = key[len("listener.name."):].partition(".")
            names &= {name.upper()}
        if key.startswith("ssl."):
            return bool(tls & names)
        return bool(sasl & names) or bool(names and key.startswith(
            ("plain.", "scram-", "oauthbearer.", "connections.")))

    return used


def _translate_listeners(out: dict[str, Any]) -> list[str]:
    """Sets host/port and advertised.host/advertised.port from Kafka's listener configs
    (unless given themselves); returns the controller listeners it does not serve."""
    if "listeners" not in out and "advertised.listeners" not in out:
        return []
    protocols = _protocol_map(str(out.get("listener.security.protocol.map",
                                          DEFAULT_PROTOCOL_MAP)))
    controllers = {n.strip().upper() for n in str(out.get("controller.listener.names", ""))
                   .split(",") if n.strip()}
    listeners = _listeners("listeners", str(out.get("listeners", "")))
    served = [entry for entry in listeners if entry[0] not in controllers]
    for name, _, _ in served:
        if name not in protocols:
            raise ConfigError("listeners", f"no security protocol for listener {name} in "
                                           "listener.security.protocol.map")
    skipped = [f"listener {n} (controller.listener.names)" for n, _, _ in listeners
               if n in controllers]
    inter = str(out.get("inter.broker.listener.name", "")).strip().upper()
    if not inter and out.get("security.inter.broker.protocol"):
        wanted = str(out["security.inter.broker.protocol"]).strip().upper()
        inter = next((n for n, _, _ in served if protocols.get(n) == wanted), "")
    chosen = [e for e in served if e[0] == inter] or served[:1]
    if chosen:
        name, host, port = chosen[0]
        out.setdefault("host", host or "0.0.0.0")
        out.setdefault("port", port)
        for adv_name, adv_host, adv_port in _listeners(
                "advertised.listeners", str(out.get("advertised.listeners", ""))):
            if adv_name == name:
                if adv_host:
                    out.setdefault("advertised.host", adv_host)
                out.setdefault("advertised.port", adv_port)
        if not host and "advertised.host" not in out:
            # Kafka advertises the machine's canonical name for an every-interface listener
            out["advertised.host"] = socket.getfqdn()
    return skipped

# Topic-level configs: name, and the broker config that gives the default.
TOPIC_CONFIGS = _defs(
    ConfigDef("cleanup.policy", "list", "delete", "delete and/or compact.",
              choices=("delete", "compact"), broker_name="log.cleanup.policy"),
    ConfigDef("compression.type", "string", "producer", "Codec for stored batches.",
              choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
              broker_name="compression.type"),
    ConfigDef("delete.retention.ms", "long", DAY_MS, "Tombstone retention when compacting.",
              at_least=0, broker_name="log.cleaner.delete.retention.ms"),
    ConfigDef("flush.messages", "long", LONG_MAX, "fsync after this many messages.",
              at_least=1, broker_name="log.flush.interval.messages"),
    ConfigDef("flush.ms", "long", LONG_MAX, "fsync after this long.", at_least=0,
              broker_name="log.flush.interval.ms"),
    ConfigDef("index.interval.bytes", "int", 4096, "Bytes between index entries.",
              at_least=0, broker_name="log.index.interval.bytes"),
    ConfigDef("max.message.bytes", "int", 1_048_588, "Largest record batch.", at_least=0,
              broker_name="message.max.bytes"),
    ConfigDef("message.timestamp.type", "string", "CreateTime", "CreateTime or "
              "LogAppendTime.", choices=("CreateTime", "LogAppendTime"),
              broker_name="log.message.timestamp.type"),
    ConfigDef("min.insync.replicas", "int", 1, "acks=all needs this many in-sync replicas.",
              at_least=1, broker_name="min.insync.replicas"),
    ConfigDef("retention.bytes", "long", -1, "Partition size limit (-1: none).",
              at_least=-1, broker_name="log.retention.bytes"),
    ConfigDef("retention.ms", "long", 7 * DAY_MS, "Segment age limit (-1: none).",
              at_least=-1, broker_name="log.retention.ms"),
    ConfigDef("segment.bytes", "int", 1_073_741_824, "Segment size before a roll.",
              at_least=14, broker_name="log.segment.bytes"),
    ConfigDef("segment.index.bytes", "int", 10_485_760, "Maximum index file size.",
              at_least=4, broker_name="log.index.size.max.bytes"),
    ConfigDef("segment.ms", "long", 7 * DAY_MS, "Segment age before a roll.", at_least=1,
              broker_name="log.roll.ms"),
    ConfigDef("unclean.leader.election.enable", "bool", False,
              "Allow an out-of-sync replica to become leader.",
              broker_name="unclean.leader.election.enable"),
    ConfigDef("message.timestamp.before.max.ms", "long", LONG_MAX,
              "Largest allowed age of a record's CreateTime at append.", at_least=0,
              broker_name="log.message.timestamp.before.max.ms"),
    ConfigDef("message.timestamp.after.max.ms", "long", 3_600_000,
              "Largest allowed lead of a record's CreateTime over the broker's clock.",
              at_least=0, broker_name="log.message.timestamp.after.max.ms"),
)

# Kafka 3.9's message format versions (MetadataVersion's IBP versions up to 3.9-IV0), as
# ``MetadataVersion.fromVersionString`` reads them: "0.x.y" by its first three parts, any
# other by its first two ("2.8", "2.8-IV1", "3.0.1" = "3.0").
_IBP_IVS = {"0.10.0": 1, "0.10.1": 2, "0.10.2": 0, "0.11.0": 2, "1.0": 0, "1.1": 0,
            "2.0": 1, "2.1": 2, "2.2": 1, "2.3": 1, "2.4": 1, "2.5": 0, "2.6": 0, "2.7": 2,
            "2.8": 1, "3.0": 1, "3.1": 0, "3.2": 0, "3.3": 3, "3.4": 0, "3.5": 2, "3.6": 2,
            "3.7": 4, "3.8": 0, "3.9": 0}
MESSAGE_FORMAT_VERSIONS = frozenset(
    {"0.8.0", "0.8.1", "0.8.2", "0.9.0", *_IBP_IVS,
     *(f"{v}-IV{i}" for v, last in _IBP_IVS.items() for i in range(last + 1))})


def _parse_message_format_version(name: str, raw: Any) -> str:
    """Kafka's ``MetadataVersionValidator``: the value as given, if Kafka 3.9 knows it."""
    text = str(raw).strip()
    parts = text.split(".")
    n = 3 if text.startswith("0.") else 2
    key = text if n >= len(parts) else ".".join(parts[:n])
    if key not in MESSAGE_FORMAT_VERSIONS:
        raise ConfigError(name, f"Version {text} is not a valid version",
                          value=raw, reason=f"Version {text} is not a valid version")
    return text


# Kafka 3.9's deprecated topic configs (``TopicConfig``'s @Deprecated names), which it still
# accepts: validated as Kafka validates them and stored as given (DescribeConfigs reports
# them), with Kafka's warning once per topic and value (``deprecated_topic_warning``).
# - message.format.version (KIP-724): ignored, as Kafka ignores it once
#   inter.broker.protocol.version is 3.0 or higher; headrace writes record batches v2 only.
# - message.timestamp.difference.max.ms (KIP-937): as in Kafka 3.9, the limit of
#   message.timestamp.before.max.ms and message.timestamp.after.max.ms where the topic
#   does not set those (``fold_deprecated_topic_configs``).
DEPRECATED_TOPIC_CONFIGS = _defs(
    ConfigDef("message.format.version", "version", "3.0-IV1",
              "[DEPRECATED] Ignored: the message format is v2 (Kafka ignores it from "
              "inter.broker.protocol.version 3.0)."),
    ConfigDef("message.timestamp.difference.max.ms", "long", LONG_MAX,
              "[DEPRECATED] The before and after limits where the topic sets neither.",
              at_least=0),
)
# every topic config name a request may set
ACCEPTED_TOPIC_CONFIGS = {**TOPIC_CONFIGS, **DEPRECATED_TOPIC_CONFIGS}
# the inter-broker protocol version headrace speaks, as Kafka 3.9 names it in its warnings
INTER_BROKER_PROTOCOL_VERSION = "3.9-IV0"


def deprecated_topic_warning(topic: str, name: str, value: str) -> str | None:
    """Kafka's warning for a deprecated topic config set on ``topic`` (``LogConfig.
    MessageFormatVersion.topicWarningMessage``), or None for one it applies silently."""
    if name != "message.format.version":
        return None
    return (f"Topic configuration message.format.version with value `{value}` is ignored "
            f"for `{topic}` because the inter-broker protocol version "
            f"`{INTER_BROKER_PROTOCOL_VERSION}` is greater or equal than 3.0. This "
            "configuration is deprecated and it will be removed in Apache Kafka 4.0.")


def fold_deprecated_topic_configs(stored: Mapping[str, str]) -> dict[str, str]:
    """A topic's stored configs as its logs run with them: Kafka 3.9's
    ``message.timestamp.difference.max.ms`` becomes the before and after limits the topic
    does not set; the deprecated names are dropped."""
    out = {k: v for k, v in stored.items() if k in TOPIC_CONFIGS}
    difference = stored.get("message.timestamp.difference.max.ms")
    if difference is not None:
        for name in ("message.timestamp.before.max.ms", "message.timestamp.after.max.ms"):
            out.setdefault(name, difference)
    return out


def parse_overrides(raw: Mapping[str, Any], defs: Mapping[str, ConfigDef]) -> dict[str, Any]:
    """Validate ``raw`` (name → value, strings allowed) against ``defs``."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        d = defs.get(name)
        if d is None:
            raise ConfigError(name, "unknown configuration",
                              kafka=f"Unknown configuration name: {name}")
        if value is None:
            raise ConfigError(name, "a value is required",
                              kafka=f"Null value not supported for configs: {name}")
        out[name] = d.parse(value)
    return out


def load_properties(path: Path) -> dict[str, str]:
    """Read a Java-style ``.properties`` file (``key=value``, ``#`` comments)."""
    out: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith(("#", "!")):
            continue
        sep = min((i for i in (text.find("="), text.find(":")) if i >= 0), default=-1)
        if sep < 0:
            raise ConfigError(f"{path}:{lineno}", f"expected key=value, got {text!r}")
        out[text[:sep].strip()] = text[sep + 1 :].strip()
    return out


@dataclass(frozen=True)
class BrokerConfig:
    """Validated broker configuration: Kafka names in ``values``.

    Dynamic broker configs (issue 27, Kafka's ``DynamicBrokerConfig``) are a layer over
    what the broker started with: this broker's (``dynamic_broker``, DYNAMIC_BROKER_CONFIG)
    over the cluster-wide default (``dynamic_default``, DYNAMIC_DEFAULT_BROKER_CONFIG) over
    ``given`` (STATIC_BROKER_CONFIG) over the defaults. ``reconfigure`` recomputes
    ``values`` in place: every component holding this object sees the change at once (the
    ones that copied a value at start are told by the broker).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    # what the file, flags or overrides set, by Kafka's names as written (``broker.id``,
    # ``log.retention.hours``, ``listeners``, ...): DescribeConfigs' STATIC_BROKER_CONFIG
    given: Mapping[str, Any] = field(default_factory=dict)
    # warnings for the operator (keys with no effect here, extra log dirs), one line each
    notes: tuple[str, ...] = ()
    # the dynamic layers (names as stored: /config/brokers/<id> and /config/brokers/<default>)
    dynamic_broker: dict[str, str] = field(default_factory=dict)
    dynamic_default: dict[str, str] = field(default_factory=dict)

    def with_dynamic(self, dynamic_default: Mapping[str, str],
                     dynamic_broker: Mapping[str, str]) -> BrokerConfig:
        """The configuration these dynamic layers would give (validated: ConfigError)."""
        layered = {**self.given, **_effective_dynamic(dynamic_default),
                   **_effective_dynamic(dynamic_broker)}
        new = BrokerConfig.from_mapping(layered)
        return BrokerConfig(new.values, self.given, self.notes, dict(dynamic_broker),
                            dict(dynamic_default))

    def reconfigure(self, dynamic_default: Mapping[str, str],
                    dynamic_broker: Mapping[str, str]) -> set[str]:
        """Apply dynamic layers in place; the names whose value changed. Raises
        ConfigError (and changes nothing) if they are invalid."""
        new = self.with_dynamic(dynamic_default, dynamic_broker)
        values = self.values
        assert isinstance(values, dict)
        changed = {k for k, v in new.values.items() if values.get(k) != v}
        values.clear()
        values.update(new.values)
        self.dynamic_broker.clear()
        self.dynamic_broker.update(dynamic_broker)
        self.dynamic_default.clear()
        self.dynamic_default.update(dynamic_default)
        return changed

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> BrokerConfig:
        values = {d.name: d.default for d in (*BROKER_CONFIGS.values(),
                                              *LISTENER_CONFIGS.values())}
        translated, notes = _translate_kafka_forms(raw)
        values.update(parse_overrides(translated, {**BROKER_CONFIGS, **LISTENER_CONFIGS}))
        return cls(values, dict(raw), notes)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def with_overrides(self, raw: Mapping[str, Any]) -> BrokerConfig:
        return BrokerConfig.from_mapping({**self.given, **raw})

    def listeners(self) -> tuple[list[Any], Any]:
        """Every listener served (``headrace.security.listeners.Listener``: protocol, TLS
        context, SASL settings) and the inter-broker client's settings; the PEM files are
        read here. Raises ``ConfigError``."""
        from headrace.security.listeners import parse_listeners

        return parse_listeners(self.given, str(self.values["host"]), int(self.values["port"]),
                               str(self.values["advertised.host"]),
                               int(self.values["advertised.port"]),
                               int(self.values["connections.max.reauth.ms"]))

    @property
    def node_id(self) -> int:
        return int(self.values["node.id"])

    @property
    def clustered(self) -> bool:
        """A member of a ZooKeeper cluster (``zookeeper.connect`` set)."""
        return bool(self.values["zookeeper.connect"])

    @property
    def data_dir(self) -> Path:
        return Path(self.values["log.dirs"])

    @property
    def log_dirs(self) -> list[Path]:
        """Every log dir, ``data_dir`` first (Kafka's ``log.dirs``, or ``log.dir``), each
        once: the others hold only replicas moved there with AlterReplicaLogDirs."""
        raw = self.given.get("log.dirs", self.given.get("log.dir"))
        dirs = [self.data_dir]
        for d in str(raw or "").split(","):
            path = Path(d.strip())
            if d.strip() and os.path.abspath(path) not in map(os.path.abspath, dirs):
                dirs.append(path)
        return dirs

    def topic_default(self, name: str) -> Any:
        d = TOPIC_CONFIGS[name]
        assert d.broker_name is not None
        return self.values[d.broker_name]


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The effective settings of one partition log (topic overrides over broker defaults)."""

    segment_bytes: int = 1_073_741_824
    segment_ms: int = 7 * DAY_MS
    segment_index_bytes: int = 10_485_760
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * DAY_MS
    retention_bytes: int = -1
    max_message_bytes: int = 1_048_588
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    cleanup_policy: str = "delete"
    delete_retention_ms: int = DAY_MS
    message_timestamp_type: str = "CreateTime"
    min_insync_replicas: int = 1
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = 3_600_000

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy.split(",")


_LOG_FIELDS = {f.name.replace("_", "."): f.name for f in dataclasses.fields(LogConfig)}


def effective_topic_config(broker: BrokerConfig, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every topic config's effective value: the override, else the broker default."""
    return {
        name: overrides[name] if name in overrides else broker.topic_default(name)
        for name in TOPIC_CONFIGS
    }


def log_config(broker: BrokerConfig, overrides: Mapping[str, Any]) -> LogConfig:
    eff = effective_topic_config(broker, overrides)
    return LogConfig(**{attr: eff[name] for name, attr in _LOG_FIELDS.items() if name in eff})


def config_table(defs: Iterable[ConfigDef]) -> str:
    """A Markdown table of the definitions (the README's configuration table)."""
    rows = ["| name | default | meaning |", "| --- | --- | --- |"]
    for d in defs:
        default = "Long.MAX" if d.default == LONG_MAX else d.to_string(d.default)
        rows.append(f"| `{d.name}` | `{default}` | {d.doc} |")
    return "\n".join(rows)


# ---- dynamic broker configs (issue 27): Kafka's DynamicBrokerConfig.AllDynamicConfigs as
# far as headrace has them. Applied at runtime: every log default that becomes a topic
# default (DynamicLogConfig: the broker synonyms of the topic configs), message.max.bytes,
# the connection limits (SocketServer), the producer-state configs and num.replica.fetchers
# (DynamicThreadPool). Accepted and stored with no effect, as they are in server.properties:
# Kafka's dynamic thread-pool and cleaner settings headrace has no use for. Every other
# known config is read-only: refused as Kafka refuses it (INVALID_CONFIG, "Cannot update
# these configs dynamically: Set(...)"). Listener and SSL configs, dynamic in Kafka, are
# read-only here (a listener is not rebuilt at runtime).
DYNAMIC_LOG_CONFIGS = frozenset(d.broker_name for d in TOPIC_CONFIGS.values() if d.broker_name)
DYNAMIC_APPLIED_CONFIGS = DYNAMIC_LOG_CONFIGS | {
    "message.max.bytes", "max.connections", "max.connections.per.ip",
    "max.connections.per.ip.overrides", "max.connection.creation.rate",
    "producer.id.expiration.ms", "transaction.partition.verification.enable",
    "num.replica.fetchers",
}
DYNAMIC_NO_EFFECT_CONFIGS = frozenset({
    "num.io.threads", "num.network.threads", "num.recovery.threads.per.data.dir",
    "background.threads", "metric.reporters", "log.cleaner.threads",
    "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size", "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.backoff.ms", "log.cleaner.min.cleanable.ratio", "log.preallocate",
    "log.segment.delete.delay.ms", "log.roll.jitter.ms",
}) & NO_EFFECT_CONFIGS
DYNAMIC_BROKER_CONFIGS = DYNAMIC_APPLIED_CONFIGS | DYNAMIC_NO_EFFECT_CONFIGS
# the name of the cluster-wide default entity (Kafka's ZooKeeperInternals.DEFAULT_STRING)
DEFAULT_ENTITY = "<default>"


def _effective_dynamic(layer: Mapping[str, str]) -> dict[str, str]:
    """A dynamic layer as server.properties-style overrides (names that are not dynamic,
    stored by another tool, are ignored)."""
    return {k: v for k, v in layer.items() if k in DYNAMIC_BROKER_CONFIGS}


def check_dynamic_names(names: Iterable[str]) -> None:
    """ConfigError for names that cannot be set dynamically (Kafka's text and order:
    ``Cannot update these configs dynamically: Set(a, b)``; unknown names too, where
    Kafka would store them unread)."""
    bad = [n for n in names if n not in DYNAMIC_BROKER_CONFIGS]
    if bad:
        raise ConfigError(bad[0], "Cannot update these configs dynamically: Set("
                          + ", ".join(bad) + ")")


# ---- group configs (issue 27 item 6): Kafka 4.2's GroupConfig. Each defaults to a broker
# config (its synonym, as DescribeConfigs reports it); validated against the broker's
# group.*.min/max bounds after merging the group's configs over the broker defaults.
GROUP_CONFIGS = _defs(
    ConfigDef("consumer.session.timeout.ms", "int", 45_000,
              "The timeout to detect client failures when using the consumer group protocol.",
              at_least=1, broker_name="group.consumer.session.timeout.ms"),
    ConfigDef("consumer.heartbeat.interval.ms", "int", 5_000,
              "The heartbeat interval given to the members of a consumer group.",
              at_least=1, broker_name="group.consumer.heartbeat.interval.ms"),
    ConfigDef("share.session.timeout.ms", "int", 45_000,
              "The timeout to detect client failures when using the share group protocol.",
              at_least=1, broker_name="group.share.session.timeout.ms"),
    ConfigDef("share.heartbeat.interval.ms", "int", 5_000,
              "The heartbeat interval given to the members of a share group.",
              at_least=1, broker_name="group.share.heartbeat.interval.ms"),
    ConfigDef("share.record.lock.duration.ms", "int", 30_000,
              "The record acquisition lock duration in milliseconds for share groups.",
              at_least=1000, broker_name="group.share.record.lock.duration.ms"),
    ConfigDef("share.auto.offset.reset", "string", "latest",
              "The strategy to initialize the share-partition start offset: earliest, "
              "latest or by_duration:<ISO-8601 duration>."),
    ConfigDef("share.isolation.level", "string", "read_uncommitted",
              "Controls how to read records written transactionally (read_committed or "
              "read_uncommitted).", choices=("read_committed", "read_uncommitted")),
    ConfigDef("streams.session.timeout.ms", "int", 45_000,
              "The timeout to detect client failures when using the streams group protocol.",
              at_least=1, broker_name="group.streams.session.timeout.ms"),
    ConfigDef("streams.heartbeat.interval.ms", "int", 5_000,
              "The heartbeat interval given to the members of a streams group.",
              at_least=1, broker_name="group.streams.heartbeat.interval.ms"),
    ConfigDef("streams.num.standby.replicas", "int", 0,
              "The number of standby replicas for each task.", at_least=0,
              broker_name="group.streams.num.standby.replicas"),
    ConfigDef("streams.initial.rebalance.delay.ms", "int", 3_000,
              "The delay of the first rebalance of a new streams group.", at_least=0,
              broker_name="group.streams.initial.rebalance.delay.ms"),
)
# (group config, broker minimum, broker maximum): Kafka's GroupConfig.validateValues order
_GROUP_BOUNDS: tuple[tuple[str, str | None, str], ...] = (
    ("consumer.heartbeat.interval.ms", "group.consumer.min.heartbeat.interval.ms",
     "group.consumer.max.heartbeat.interval.ms"),
    ("consumer.session.timeout.ms", "group.consumer.min.session.timeout.ms",
     "group.consumer.max.session.timeout.ms"),
    ("share.heartbeat.interval.ms", "group.share.min.heartbeat.interval.ms",
     "group.share.max.heartbeat.interval.ms"),
    ("share.session.timeout.ms", "group.share.min.session.timeout.ms",
     "group.share.max.session.timeout.ms"),
    ("share.record.lock.duration.ms", "group.share.min.record.lock.duration.ms",
     "group.share.max.record.lock.duration.ms"),
    ("streams.heartbeat.interval.ms", "group.streams.min.heartbeat.interval.ms",
     "group.streams.max.heartbeat.interval.ms"),
    ("streams.session.timeout.ms", "group.streams.min.session.timeout.ms",
     "group.streams.max.session.timeout.ms"),
    ("streams.num.standby.replicas", None, "group.streams.max.standby.replicas"),
)
_DURATION = re.compile(r"^P(?!$)(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$")


class GroupConfigError(ValueError):
    """A group config change Kafka refuses with INVALID_CONFIG; the message is Kafka's."""


def group_config_default(broker: BrokerConfig, name: str) -> Any:
    d = GROUP_CONFIGS[name]
    return broker[d.broker_name] if d.broker_name else d.default


def effective_group_config(broker: BrokerConfig, overrides: Mapping[str, str]) -> dict[str, Any]:
    """Every group config's value: the group's own, else its broker default."""
    return {name: d.parse(overrides[name]) if name in overrides
            else group_config_default(broker, name) for name, d in GROUP_CONFIGS.items()}


def validate_group_configs(broker: BrokerConfig, overrides: Mapping[str, str]) -> dict[str, str]:
    """Kafka's ``GroupConfig.validate``: known names, parseable values, within the broker's
    bounds, sessions longer than heartbeats (after merging over the broker defaults).
    Returns the overrides normalized; raises GroupConfigError with Kafka's text."""
    for name in overrides:
        if name not in GROUP_CONFIGS:
            raise GroupConfigError(f"Unknown group config name: {name}")
    out: dict[str, str] = {}
    for name, raw in overrides.items():
        d = GROUP_CONFIGS[name]
        try:
            value = d.parse(raw)
        except ConfigError:
            raise GroupConfigError(f"Invalid value {raw} for configuration {name}: "
                                   + _group_expectation(d, raw)) from None
        if name == "share.auto.offset.reset":
            low = str(value).lower()
            if not (low in ("earliest", "latest") or (low.startswith("by_duration:")
                    and _DURATION.match(low[len("by_duration:"):].upper()))):
                raise GroupConfigError(f"Invalid value {raw} for configuration {name}: "
                                       "Invalid value for share.auto.offset.reset")
        out[name] = d.to_string(value)
    values = effective_group_config(broker, out)
    for name, lo, hi in _GROUP_BOUNDS:
        if lo is not None and values[name] < broker[lo]:
            raise GroupConfigError(f"{name} must be greater than or equal to {lo}")
        if values[name] > broker[hi]:
            raise GroupConfigError(f"{name} must be less than or equal to {hi}")
    for kind in ("consumer", "share", "streams"):
        session, heartbeat = f"{kind}.session.timeout.ms", f"{kind}.heartbeat.interval.ms"
        if values[session] <= values[heartbeat]:
            raise GroupConfigError(f"{session} must be greater than {heartbeat}")
    return out


def _group_expectation(d: ConfigDef, raw: Any) -> str:
    """The reason Kafka's ConfigDef gives for a refused value."""
    if d.choices:
        return f"String must be one of: {', '.join(d.choices)}"
    try:
        int(str(raw).strip())
    except ValueError:
        return f"Not a number of type {d.kind.upper()}"
    return f"Value must be at least {d.at_least}"


_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_duration_ms(text: str) -> int | None:
    """An ISO-8601 duration as Java's ``Duration.parse`` reads the common forms
    (``PnDTnHnMn.nS``), in milliseconds; None when it is not one."""
    m = _DURATION.match(text.strip().upper())
    if m is None or not any(m.groups()):
        return None
    days, hours, minutes, seconds = m.groups()
    td = timedelta(days=int(days or 0), hours=int(hours or 0), minutes=int(minutes or 0),
                   seconds=float(seconds or 0))
    return int(td.total_seconds() * 1000)
