"""Topic administration shared by CreateTopics, auto-creation, CreatePartitions and configs.

Pure decisions (name rules, replica assignment) are plain functions; ``TopicAdmin`` applies
them to the metadata store and the replica manager. Errors are ``TopicError`` carrying the
Kafka error code and a message for the response's ``error_message``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from headrace.broker.replica_manager import ReplicaManager
from headrace.config import TOPIC_CONFIGS, BrokerConfig, ConfigDef, ConfigError, parse_overrides
from headrace.metadata.store import MetadataStore, PartitionState, TopicState

log = logging.getLogger("headrace.topics")

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
MAX_PARTITIONS = 100_000


class TopicError(Exception):
    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


def validate_topic_name(name: str | None) -> str:
    """Kafka's rules (``Topic.validate``)."""
    if not name:
        raise TopicError(ErrorCode.invalid_topic_exception, "Topic name is empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.invalid_topic_exception, f"Topic name cannot be {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"Topic name is longer than {MAX_NAME_LENGTH} characters",
        )
    if not _LEGAL.match(name):
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"Topic name {name!r} is illegal: only ASCII alphanumerics, '.', '_' and '-'",
        )
    return name


def assign_replicas(
    brokers: list[int], num_partitions: int, replication_factor: int, start: int = 0
) -> list[list[int]]:
    """Round-robin replica assignment: leaders spread evenly (R-REP-1)."""
    if replication_factor > len(brokers):
        raise TopicError(
            ErrorCode.invalid_replication_factor,
            f"Replication factor: {replication_factor} larger than available brokers: "
            f"{len(brokers)}.",
        )
    n = len(brokers)
    ordered = sorted(brokers)
    return [
        [ordered[(start + p + r) % n] for r in range(replication_factor)]
        for p in range(num_partitions)
    ]


def validate_configs(raw: Mapping[str, Any]) -> dict[str, str]:
    """Topic config overrides as canonical strings; TopicError(INVALID_CONFIG) if bad."""
    try:
        parsed = parse_overrides(raw, TOPIC_CONFIGS)
    except ConfigError as e:
        raise TopicError(ErrorCode.invalid_config, f"Invalid config {e}") from None
    return {k: TOPIC_CONFIGS[k].to_string(v) for k, v in parsed.items()}


def config_def(name: str) -> ConfigDef | None:
    return TOPIC_CONFIGS.get(name)


class TopicAdmin:
    def __init__(
        self, config: BrokerConfig, metadata: MetadataStore, replicas: ReplicaManager
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.replicas = replicas

    def create(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, Any],
        *,
        assignment: list[list[int]] | None = None,
        validate_only: bool = False,
    ) -> TopicState | None:
        validate_topic_name(name)
        if self.metadata.topic(name) is not None:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if num_partitions == -1:
            num_partitions = int(self.config["num.partitions"])
        if replication_factor == -1:
            replication_factor = int(self.config["default.replication.factor"])
        if assignment is None:
            if not 1 <= num_partitions <= MAX_PARTITIONS:
                raise TopicError(
                    ErrorCode.invalid_partitions,
                    f"Number of partitions must be between 1 and {MAX_PARTITIONS}.",
                )
            if replication_factor < 1:
                raise TopicError(
                    ErrorCode.invalid_replication_factor,
                    "Replication factor must be larger than 0.",
                )
            brokers = [b.node_id for b in self.metadata.live_brokers()]
            assignment = assign_replicas(brokers, num_partitions, replication_factor)
        else:
            live = {b.node_id for b in self.metadata.live_brokers()}
            for replicas in assignment:
                if not replicas or len(set(replicas)) != len(replicas) or set(replicas) - live:
                    raise TopicError(
                        ErrorCode.invalid_replica_assignment,
                        f"Invalid replica assignment {replicas}",
                    )
        overrides = validate_configs(configs)
        if validate_only:
            return None
        states = [PartitionState(replicas=r, leader=r[0], isr=list(r)) for r in assignment]
        topic = self.metadata.create_topic(name, states, overrides)
        self.replicas.open_topic(topic, range(len(states)))
        log.info("created topic %s partitions=%d replication=%d configs=%s",
                 name, len(states), len(assignment[0]), overrides)
        return topic

    def auto_create(self, name: str) -> TopicState:
        topic = self.create(name, -1, -1, {})
        assert topic is not None
        return topic

    def delete(self, name: str) -> None:
        if self.metadata.topic(name) is None:
            raise TopicError(
                ErrorCode.unknown_topic_or_partition,
                "This server does not host this topic-partition.",
            )
        if not self.config["delete.topic.enable"]:
            raise TopicError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")
        self.metadata.delete_topic(name)
        self.replicas.delete_topic(name)
        log.info("deleted topic %s", name)

    def add_partitions(
        self,
        name: str,
        count: int,
        assignment: list[list[int]] | None,
        validate_only: bool,
    ) -> None:
        topic = self.metadata.topic(name)
        if topic is None:
            raise TopicError(
                ErrorCode.unknown_topic_or_partition,
                "This server does not host this topic-partition.",
            )
        current = len(topic.partitions)
        if count <= current:
            raise TopicError(
                ErrorCode.invalid_partitions,
                f"Topic currently has {current} partitions, {count} would not be an increase.",
            )
        if count > MAX_PARTITIONS:
            raise TopicError(ErrorCode.invalid_partitions, "Too many partitions.")
        rf = len(topic.partitions[0].replicas)
        brokers = [b.node_id for b in self.metadata.live_brokers()]
        if assignment is None:
            new = assign_replicas(brokers, count - current, rf, start=current)
        else:
            if len(assignment) != count - current:
                raise TopicError(
                    ErrorCode.invalid_replica_assignment,
                    f"Increasing the number of partitions by {count - current} but "
                    f"{len(assignment)} assignments provided.",
                )
            new = assignment
            for replicas in new:
                if len(replicas) != rf or set(replicas) - set(brokers):
                    raise TopicError(
                        ErrorCode.invalid_replica_assignment,
                        f"Invalid replica assignment {replicas}",
                    )
        if validate_only:
            return
        states = [PartitionState(replicas=r, leader=r[0], isr=list(r)) for r in new]
        self.metadata.add_partitions(name, states)
        self.replicas.open_topic(topic, range(current, count))
        log.info("topic %s now has %d partitions", name, count)

    def set_configs(self, name: str, overrides: Mapping[str, str]) -> None:
        topic = self.metadata.topic(name)
        assert topic is not None
        self.metadata.set_topic_configs(name, overrides)
        self.replicas.update_topic_config(topic)
        log.info("topic %s configs now %s", name, dict(overrides))
