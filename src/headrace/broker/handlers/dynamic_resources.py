"""AlterConfigs (33) and IncrementalAlterConfigs (44) on BROKER and GROUP resources (issue 27).

BROKER (Kafka's ``ZkAdminManager.alterBrokerConfigs``): the resource name is this broker's
id (its dynamic configs) or empty (the cluster-wide default). A name that is not an integer
is INVALID_REQUEST "Broker id must be an integer, but it is: X", another broker's id
INVALID_REQUEST "Unexpected broker id, expected N, but received X". AlterConfigs replaces
the entity's whole set of dynamic configs, IncrementalAlterConfigs edits it (SET, DELETE,
APPEND/SUBTRACT on list configs). A config that cannot change dynamically or a bad value is
INVALID_CONFIG "Invalid config value for resource ConfigResource(type=BROKER, name='0'):
Cannot update these configs dynamically: Set(log.dirs)". Needs ALTER_CONFIGS on the cluster.

GROUP (type 32, Kafka 4.x's group configs): the group's configs, validated by
``config.validate_group_configs`` (INVALID_CONFIG with Kafka's texts: "Unknown group config
name: X", "consumer.session.timeout.ms must be greater than or equal to
group.consumer.min.session.timeout.ms"); an empty group name is INVALID_REQUEST. Needs
ALTER_CONFIGS on the group (GROUP_AUTHORIZATION_FAILED).

The whole resource is validated before anything is stored; ``validate_only`` stores nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from headrace.broker.dynamic_config import DynamicConfigError
from headrace.broker.security import ALTER_CONFIGS
from headrace.broker.security import GROUP as ACL_GROUP
from headrace.config import BROKER_CONFIGS, GROUP_CONFIGS, ConfigDef

if TYPE_CHECKING:
    from headrace.broker.handlers.base import RequestContext
    from headrace.broker.server import Broker

BROKER, GROUP = 4, 32
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
Result = tuple[ErrorCode, str | None]


def broker_id_error(broker: Broker, name: str) -> str | None:
    """Kafka's checks of a BROKER resource's name (None: this broker or the default)."""
    if not name:
        return None
    try:
        broker_id = int(name)
    except ValueError:
        return f"Broker id must be an integer, but it is: {name}"
    if broker_id != broker.node_id:
        return f"Unexpected broker id, expected {broker.node_id}, but received {name}"
    return None


def handles(resource_type: int) -> bool:
    return int(resource_type) in (BROKER, GROUP)


async def alter(broker: Broker, ctx: RequestContext, r: Any, validate_only: bool,
                incremental: bool) -> Result:
    """One BROKER or GROUP resource of an alter request; its error code and message."""
    name = str(r.resource_name)
    if int(r.resource_type) == BROKER:
        if not broker.security.cluster_allowed(ctx, ALTER_CONFIGS):
            return ErrorCode.cluster_authorization_failed, None
        bad = broker_id_error(broker, name)
        if bad is not None:
            return ErrorCode.invalid_request, bad
        current = broker.metadata.entity_configs(
            broker.dynamic.own_entity if name else broker.dynamic.default_entity)
        try:
            new = _edit(current, r.configs, BROKER_CONFIGS, incremental)
            broker.dynamic.validate_broker(name, new)
        except DynamicConfigError as e:
            return ErrorCode.invalid_config, str(e)
        except _RequestError as e:
            return ErrorCode.invalid_request, str(e)
        if not validate_only:
            await broker.dynamic.store_broker(name, new)
        return ErrorCode.none, None
    if not broker.security.allowed(ctx, ALTER_CONFIGS, ACL_GROUP, name):
        return ErrorCode.group_authorization_failed, None
    if not name:
        return ErrorCode.invalid_request, "Group name must not be empty"
    try:
        new = _edit(broker.dynamic.group_overrides(name), r.configs, GROUP_CONFIGS,
                    incremental)
        new = broker.dynamic.validate_group(new)
    except DynamicConfigError as e:
        return ErrorCode.invalid_config, str(e)
    except _RequestError as e:
        return ErrorCode.invalid_request, str(e)
    if not validate_only:
        await broker.dynamic.store_group(name, new)
    return ErrorCode.none, None


class _RequestError(Exception):
    pass


def _edit(current: dict[str, str], ops: Any, defs: dict[str, ConfigDef],
          incremental: bool) -> dict[str, str]:
    """The entity's configs after the request: AlterConfigs' entries replace them all
    (duplicates and nulls were refused before), IncrementalAlterConfigs' ops edit them."""
    if not incremental:
        return {str(c.name): str(c.value) for c in ops}
    names = [c.name for c in ops]
    if len(set(names)) != len(names):
        raise _RequestError("Error due to duplicate config keys")
    new = dict(current)
    for c in ops:
        op = int(c.config_operation)
        if op == SET:
            if c.value is None:
                raise _RequestError(f"Null value not supported for : {c.name}")
            new[c.name] = str(c.value)
        elif op == DELETE:
            new.pop(c.name, None)
        elif op in (APPEND, SUBTRACT):
            d = defs.get(c.name)
            if d is None or d.kind != "list":
                word = "append" if op == APPEND else "subtract"
                raise DynamicConfigError(
                    f"Config value {word} is not allowed for config key: {c.name}")
            items = [x for x in new.get(c.name, str(d.default)).split(",") if x]
            given = [x.strip() for x in (c.value or "").split(",") if x.strip()]
            if op == APPEND:
                items += [x for x in given if x not in items]
            else:
                items = [x for x in items if x not in given]
            new[c.name] = ",".join(items)
        else:
            raise _RequestError(f"Unknown config operation {op}")
    return new
