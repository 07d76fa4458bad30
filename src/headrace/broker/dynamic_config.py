"""Dynamic broker configs and group configs (issue 27): the shell around ``headrace.config``.

Dynamic broker configs, as Kafka's ``DynamicBrokerConfig``: AlterConfigs and
IncrementalAlterConfigs on a BROKER resource change this broker's configs (resource name =
its id: ``brokers/<id>``) or the cluster-wide default (empty name: ``brokers/<default>``)
without a restart. Stored in the metadata store by Kafka's entity path (on a cluster in
ZooKeeper at ``/config/brokers/<id>`` and ``/config/brokers/<default>``, announced on
``/config/changes`` so every broker applies a new default; on a single node in the local
metadata store). Precedence: this broker's, the default, the config file, Kafka's default.
At start and on every change the broker recomputes its ``BrokerConfig`` in place and tells
the components that copied a value (``apply``): the log defaults of every hosted partition
(topics without an override follow the new default), the connection limits, the replica
fetchers. Names outside ``DYNAMIC_BROKER_CONFIGS`` are refused, with Kafka's code and text.

Group configs (KIP-848's and KIP-932's ``GroupConfig``): IncrementalAlterConfigs on a GROUP
resource, stored at ``groups/<group>`` (``/config/groups/<group>`` on a cluster); a consumer
group (KIP-848) and a share group (KIP-932) take their session timeout and heartbeat
interval from them, at once when they change.

Thread-safety: the event loop only; store writes of a cluster go to a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from headrace.broker.security import store_change
from headrace.cluster.zk_layout import broker_entity, group_entity
from headrace.config import (
    DYNAMIC_LOG_CONFIGS,
    ConfigError,
    GroupConfigError,
    check_dynamic_names,
    effective_group_config,
    validate_group_configs,
)

if TYPE_CHECKING:
    from headrace.broker.server import Broker

log = logging.getLogger(__name__)

_CONNECTION_CONFIGS = frozenset({"max.connections", "max.connections.per.ip",
                                 "max.connections.per.ip.overrides"})


class DynamicConfigError(Exception):
    """A dynamic change refused: INVALID_CONFIG with this message (Kafka's wording)."""


def resource_text(resource_type: str, name: str) -> str:
    """Kafka's ``ConfigResource.toString``, which its error texts quote."""
    return f"ConfigResource(type={resource_type}, name='{name}')"


class DynamicConfigs:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    # ------------------------------------------------------------------ broker configs
    @property
    def own_entity(self) -> str:
        return broker_entity(self.broker.node_id)

    @property
    def default_entity(self) -> str:
        return broker_entity(None)

    def layers(self) -> tuple[dict[str, str], dict[str, str]]:
        """(the cluster-wide default, this broker's) as stored."""
        store = self.broker.metadata
        return store.entity_configs(self.default_entity), store.entity_configs(self.own_entity)

    def validate_broker(self, resource_name: str, new: Mapping[str, str]) -> None:
        """DynamicConfigError if ``new`` may not become the configs of the entity (names
        that cannot change dynamically, values that do not parse)."""
        try:
            check_dynamic_names(new)
            default, own = self.layers()
            if resource_name:
                own = dict(new)
            else:
                default = dict(new)
            candidate = self.broker.config.with_dynamic(default, own)
            from headrace.broker.memory_pool import parse_per_ip_overrides

            try:
                parse_per_ip_overrides(str(candidate["max.connections.per.ip.overrides"]))
            except ValueError as e:
                raise ConfigError("max.connections.per.ip.overrides", str(e)) from None
        except ConfigError as e:
            raise DynamicConfigError(
                f"Invalid config value for resource {resource_text('BROKER', resource_name)}: "
                f"{_reason(e)}") from None

    async def store_broker(self, resource_name: str, new: Mapping[str, str]) -> None:
        """Persist validated configs of the entity and apply them here."""
        path = self.own_entity if resource_name else self.default_entity
        store = self.broker.metadata
        await store_change(self.broker.config.clustered, store.change_entity_configs, path,
                           dict(new))
        store.install_entity_configs(path, dict(new))
        log.info("dynamic %s configs now %s", "broker" if resource_name else
                 "default broker", dict(new) or "{}")
        self.apply()

    def apply(self) -> None:
        """Recompute the broker's config from the stored layers and tell the components
        that copied a value. A layer that no longer validates (another tool wrote it) is
        ignored with one line, as Kafka ignores invalid dynamic configs."""
        default, own = self.layers()
        config = self.broker.config
        try:
            changed = config.reconfigure(default, own)
        except ConfigError as e:
            log.error("ignoring dynamic broker configs: %s", e)
            return
        if changed:
            self._changed(changed)

    def _changed(self, names: set[str]) -> None:
        broker = self.broker
        config = broker.config
        if names & DYNAMIC_LOG_CONFIGS or "message.max.bytes" in names:
            for topic in list(broker.metadata.topics().values()):
                broker.replicas.update_topic_config(topic)
        if names & _CONNECTION_CONFIGS:
            from headrace.broker.memory_pool import parse_per_ip_overrides
            from headrace.broker.server import _resolve_overrides

            quotas = broker.quotas
            quotas.max_connections = int(config["max.connections"])
            quotas.max_per_ip = int(config["max.connections.per.ip"])
            try:
                quotas.overrides = _resolve_overrides(parse_per_ip_overrides(
                    str(config["max.connections.per.ip.overrides"])))
            except ValueError as e:
                log.error("max.connections.per.ip.overrides: %s (keeping the old ones)", e)
        if "max.connection.creation.rate" in names:
            broker.client_quotas.connections.broker_rate = float(
                config["max.connection.creation.rate"])
        if "num.replica.fetchers" in names and broker.cluster is not None:
            broker.cluster.fetchers.resize(int(config["num.replica.fetchers"]))

    # ------------------------------------------------------------------ group configs
    def group_overrides(self, group: str) -> dict[str, str]:
        return self.broker.metadata.entity_configs(group_entity(group))

    def validate_group(self, new: Mapping[str, str]) -> dict[str, str]:
        try:
            return validate_group_configs(self.broker.config, new)
        except GroupConfigError as e:
            raise DynamicConfigError(str(e)) from None

    async def store_group(self, group: str, new: Mapping[str, str]) -> None:
        path = group_entity(group)
        store = self.broker.metadata
        await store_change(self.broker.config.clustered, store.change_entity_configs, path,
                           dict(new))
        store.install_entity_configs(path, dict(new))
        log.info("group %s configs now %s", group, dict(new) or "{}")
        self.apply_group(group)

    def group_values(self, group: str) -> dict[str, Any]:
        """Every group config's effective value (stored ones that no longer parse are
        left out: the broker default applies)."""
        overrides = self.group_overrides(group)
        try:
            return effective_group_config(self.broker.config, overrides)
        except ConfigError:
            return effective_group_config(self.broker.config, {})

    def apply_group(self, group: str) -> None:
        """A KIP-848 or share group that exists takes its new session timeout and
        heartbeat interval at once (the next heartbeat carries the interval, and sets the
        member's deadline with the timeout), as Kafka reads them from its
        ``GroupConfigManager`` on every heartbeat."""
        from headrace.group.consumer_group import ConsumerGroup
        from headrace.share.group import ShareGroup

        g = self.broker.groups.coordinator.groups.get(group)
        if isinstance(g, ConsumerGroup):
            values = self.group_values(group)
            g.session_timeout_ms = int(values["consumer.session.timeout.ms"])
            g.heartbeat_interval_ms = int(values["consumer.heartbeat.interval.ms"])
        elif isinstance(g, ShareGroup):
            values = self.group_values(group)
            g.session_timeout_ms = int(values["share.session.timeout.ms"])
            g.heartbeat_interval_ms = int(values["share.heartbeat.interval.ms"])

    # ------------------------------------------------------------------ store listener
    def entity_configs_changed(self, path: str) -> None:
        """A ZooKeeper notification: an entity's configs changed (maybe by another
        broker: the default broker configs apply everywhere)."""
        if path in (self.own_entity, self.default_entity):
            self.apply()
        elif path.startswith("groups/"):
            from headrace.cluster.zk_layout import desanitize

            self.apply_group(desanitize(path[len("groups/"):]))


def _reason(e: ConfigError) -> str:
    """ConfigError's text without the leading name Kafka does not repeat."""
    text = str(e)
    prefix = f"{e.name}: "
    return text[len(prefix):] if text.startswith(prefix) and "Set(" in text else text
