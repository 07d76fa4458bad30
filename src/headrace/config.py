"""Broker and topic configuration: one table of definitions, Kafka's names and defaults.

Topic-level configs (``retention.ms``) take their default from a broker-level config
(``log.retention.ms``), exactly as Kafka does; a topic stores only its overrides and the
effective value is resolved against the broker's config. Values are parsed and validated
here, so a bad value anywhere (config file, flag, CreateTopics, IncrementalAlterConfigs)
gets the same clear ``ConfigError`` (mapped to INVALID_CONFIG by handlers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LONG_MAX = 9_223_372_036_854_775_807
INT_MAX = 2_147_483_647


class ConfigError(ValueError):
    """A configuration value (or name) is invalid. The message says which and why."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


# --------------------------------------------------------------------------- parsing


def _parse_int(bits: int) -> Callable[[str, Any], int]:
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def parse(name: str, raw: Any) -> int:
        if isinstance(raw, bool):
            raise ConfigError(name, f"expected an integer, got {raw!r}")
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ConfigError(name, f"expected an integer, got {raw!r}") from None
        if not lo <= value <= hi:
            raise ConfigError(name, f"{value} does not fit in a {bits}-bit integer")
        return value

    return parse


def _parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ConfigError(name, f"expected true or false, got {raw!r}")


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

    def parse(self, raw: Any) -> Any:
        parser = {
            "int": _parse_int(32),
            "long": _parse_int(64),
            "bool": _parse_bool,
            "string": _parse_str,
            "list": _parse_list,
        }[self.kind]
        value: Any = parser(self.name, raw)
        if self.at_least is not None and value < self.at_least:
            raise ConfigError(self.name, f"value {value} must be at least {self.at_least}")
        if self.kind == "list" and not value:
            raise ConfigError(self.name, "must not be empty")
        if self.choices is not None:
            values = value.split(",") if self.kind == "list" else [value]
            for v in values:
                if v not in self.choices:
                    raise ConfigError(
                        self.name, f"{v!r} is not one of {', '.join(self.choices)}"
                    )
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
    ConfigDef("connections.max.idle.ms", "long", 600_000,
              "Close connections idle (or stuck mid-request) for this long.", at_least=1),
    ConfigDef("max.connections", "int", 10_000, "Most open client connections.",
              at_least=1),
    ConfigDef("max.connections.per.ip", "int", INT_MAX,
              "Most open connections from one address.", at_least=1),
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
)

# Kafka's older names accepted as aliases (ZooKeeper-mode server.properties).
BROKER_ALIASES = {"broker.id": "node.id"}

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


def parse_overrides(raw: Mapping[str, Any], defs: Mapping[str, ConfigDef]) -> dict[str, Any]:
    """Validate ``raw`` (name → value, strings allowed) against ``defs``."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        d = defs.get(name)
        if d is None:
            raise ConfigError(name, "unknown configuration")
        if value is None:
            raise ConfigError(name, "a value is required")
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
    """Validated broker configuration: Kafka names in ``values``."""

    values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> BrokerConfig:
        values = {d.name: d.default for d in BROKER_CONFIGS.values()}
        raw = {BROKER_ALIASES.get(k, k): v for k, v in raw.items()}
        values.update(parse_overrides(raw, BROKER_CONFIGS))
        return cls(values)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def with_overrides(self, raw: Mapping[str, Any]) -> BrokerConfig:
        return BrokerConfig.from_mapping({**self.values, **raw})

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
