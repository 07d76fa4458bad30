"""A share group's effective settings (KIP-932): its ``share.*`` group configs (Kafka 4.2's
``GroupConfig``, set with IncrementalAlterConfigs on the GROUP resource and validated by
``headrace.config.validate_group_configs``) over the broker's ``group.share.*`` defaults
(``GroupCoordinatorConfig`` / ``ShareGroupConfig``), as Kafka's ``GroupConfigManager``
answers ``groupConfig(groupId)`` with the broker's values filled in.

``share_group_config(broker, group_id)`` is what the group coordinator (session timeout,
heartbeat interval) and the share-partition side (lock duration, auto offset reset,
isolation level, delivery count limit, record locks) read. In Kafka 4.2 the delivery count
limit and the record-lock limit are broker configs only (group configs from Kafka 4.3,
KIP-1240): they are given here under their ``share.*`` names with the broker's value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.config import GROUP_CONFIGS, ConfigError, effective_group_config

if TYPE_CHECKING:
    from headrace.broker.server import Broker

# the share.* group configs of Kafka 4.2's GroupConfig
SHARE_GROUP_CONFIG_NAMES = tuple(n for n in GROUP_CONFIGS if n.startswith("share."))
# settings a share group reads that Kafka 4.2 keeps at broker level: (name here, broker config)
BROKER_ONLY = (
    ("share.delivery.count.limit", "group.share.delivery.count.limit"),
    ("share.partition.max.record.locks", "group.share.partition.max.record.locks"),
)


def share_group_config(broker: Broker, group_id: str) -> dict[str, Any]:
    """Every effective share setting of ``group_id``: ``share.session.timeout.ms``,
    ``share.heartbeat.interval.ms``, ``share.record.lock.duration.ms`` (ints),
    ``share.auto.offset.reset``, ``share.isolation.level`` (strings),
    ``share.delivery.count.limit`` and ``share.partition.max.record.locks`` (ints, the
    broker's). A stored group config that no longer parses is ignored (the broker default
    applies), as ``DynamicConfig.group_values`` does."""
    dynamic = getattr(broker, "dynamic", None)
    if dynamic is not None:
        values = dynamic.group_values(group_id)
    else:
        try:
            values = effective_group_config(broker.config, {})
        except ConfigError:  # pragma: no cover - defaults always parse
            values = {}
    out: dict[str, Any] = {n: values[n] for n in SHARE_GROUP_CONFIG_NAMES if n in values}
    for name, broker_name in BROKER_ONLY:
        out[name] = int(broker.config[broker_name])
    return out
