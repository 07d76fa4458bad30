"""Kafka's ZooKeeper layout and JSON formats, as Kafka 3.x in ZooKeeper mode wrote them
(``kafka.zk.ZkData``). PURE: paths, encoders and decoders; decoders raise ``LayoutError``
with a clear message for anything malformed (another program may have written it).
"""

from __future__ import annotations

import base64
import json
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

from headrace.metadata.store import BrokerInfo, Endpoint, PartitionState
from headrace.security import acl

BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONFIG_TOPICS = "/config/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster/id"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
DELETE_TOPICS = "/admin/delete_topics"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
PREFERRED_ELECTION = "/admin/preferred_replica_election"
CONTROLLED_SHUTDOWN = "/admin/controlled_shutdown"  # headrace's own (no RPC in kio)
# headrace's own, instead of Kafka's LeaderAndIsr/UpdateMetadata requests: every write of a
# partition state znode (the controller's, a leader's ISR change) creates, in the same
# transaction, a sequential child here carrying the new state; every broker keeps one child
# watch on it, not a watch per partition. The parent's data: the highest sequence number
# removed (a reader that had not seen it reads every state again)
STATE_CHANGES = "/headrace/state_changes"
STATE_CHANGE_PREFIX = "state_change_"
PERSISTENT_PATHS = (BROKER_IDS, TOPICS, CONFIG_TOPICS, DELETE_TOPICS, CONTROLLED_SHUTDOWN,
                    "/cluster", "/config/changes", "/isr_change_notification", STATE_CHANGES)


class LayoutError(ValueError):
    """A znode's content is not what Kafka writes there."""


def broker_path(node_id: int) -> str:
    return f"{BROKER_IDS}/{node_id}"


def topic_path(name: str) -> str:
    return f"{TOPICS}/{name}"


def partitions_path(name: str) -> str:
    return f"{TOPICS}/{name}/partitions"


def partition_path(name: str, partition: int) -> str:
    return f"{TOPICS}/{name}/partitions/{partition}"


def state_path(name: str, partition: int) -> str:
    return f"{TOPICS}/{name}/partitions/{partition}/state"


def config_path(name: str) -> str:
    return f"{CONFIG_TOPICS}/{name}"


def _load(data: bytes | None, what: str) -> Any:
    if data is None:
        raise LayoutError(f"{what}: no data")
    try:
        return json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LayoutError(f"{what}: not JSON ({e})") from None


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def topic_id_text(topic_id: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 of the 16 bytes, no padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def parse_topic_id(text: str) -> uuid.UUID:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return uuid.UUID(bytes=raw)
    except (ValueError, TypeError) as e:
        raise LayoutError(f"bad topic id {text!r}: {e}") from None


# ---------------------------------------------------------------- brokers
def encode_broker(b: BrokerInfo, now_ms: int) -> bytes:
    """BrokerIdZNode version 5: every listener's endpoint and protocol; ``host``/``port``
    are the PLAINTEXT listener's (null/-1 without one), as Kafka writes them."""
    endpoints = b.endpoints or (Endpoint("PLAINTEXT", "PLAINTEXT", b.host, b.port),)
    plain = next((e for e in endpoints if e.protocol == "PLAINTEXT"), None)
    return _dump({
        "features": {},
        "listener_security_protocol_map": {e.listener: e.protocol for e in endpoints},
        "endpoints": [f"{e.listener}://{_host(e.host)}:{e.port}" for e in endpoints],
        "rack": b.rack, "jmx_port": -1,
        "port": plain.port if plain else -1, "host": plain.host if plain else None,
        "version": 5, "timestamp": str(now_ms),
    })


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def decode_broker(node_id: int, data: bytes | None,
                  inter_broker_listener: str = "PLAINTEXT") -> BrokerInfo:
    """``host``/``port`` of the result: the endpoint of ``inter_broker_listener`` (every
    broker of a cluster uses the same name), else the first endpoint, else the legacy
    host/port fields."""
    d = _load(data, f"broker {node_id}")
    try:
        protocols = {str(k).upper(): str(v).upper()
                     for k, v in (d.get("listener_security_protocol_map") or {}).items()}
        endpoints = []
        for ep in d.get("endpoints") or []:
            name, sep, hp = str(ep).partition("://")
            if not sep:
                continue
            host, port = hp.rsplit(":", 1)
            name = name.upper()
            endpoints.append(Endpoint(name, protocols.get(name, name), host.strip("[]"),
                                      int(port)))
        chosen = next((e for e in endpoints if e.listener == inter_broker_listener),
                      endpoints[0] if endpoints else None)
        where: tuple[Any, Any] = ((chosen.host, chosen.port) if chosen
                                  else (d.get("host"), d.get("port")))
        rack = d.get("rack")
        return BrokerInfo(node_id, str(where[0]), int(where[1]), str(rack) if rack else None,
                          tuple(endpoints))
    except (AttributeError, TypeError, ValueError) as e:
        raise LayoutError(f"broker {node_id}: {e}") from None


# ---------------------------------------------------------------- topics
@dataclass(frozen=True, slots=True)
class TopicAssignment:
    topic_id: uuid.UUID
    partitions: dict[int, list[int]]
    adding: dict[int, list[int]]
    removing: dict[int, list[int]]


def encode_topic(topic_id: uuid.UUID, partitions: dict[int, list[int]],
                 adding: dict[int, list[int]] | None = None,
                 removing: dict[int, list[int]] | None = None) -> bytes:
    """TopicZNode version 3."""
    def m(x: dict[int, list[int]] | None) -> dict[str, list[int]]:
        return {str(k): list(v) for k, v in sorted((x or {}).items())}

    return _dump({"partitions": m(partitions), "topic_id": topic_id_text(topic_id),
                  "adding_replicas": m(adding), "removing_replicas": m(removing),
                  "version": 3})


def decode_topic(name: str, data: bytes | None) -> TopicAssignment:
    d = _load(data, f"topic {name}")
    try:
        def m(x: Any) -> dict[int, list[int]]:
            return {int(k): [int(r) for r in v] for k, v in dict(x or {}).items()}

        parts = m(d["partitions"])
        if sorted(parts) != list(range(len(parts))):
            raise ValueError(f"partitions {sorted(parts)} are not 0..n-1")
        topic_id = parse_topic_id(d["topic_id"]) if d.get("topic_id") else uuid.UUID(int=0)
        return TopicAssignment(topic_id, parts, m(d.get("adding_replicas")),
                               m(d.get("removing_replicas")))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise LayoutError(f"topic {name}: {e}") from None


def encode_state(s: PartitionState, controller_epoch: int) -> bytes:
    """TopicPartitionStateZNode version 1."""
    return _dump({"controller_epoch": controller_epoch, "leader": s.leader, "version": 1,
                  "leader_epoch": s.leader_epoch, "isr": list(s.isr)})


StateFields = tuple[int, int, list[int], int]
"""(leader, leader_epoch, isr, controller_epoch) of a partition state znode."""


def decode_state(what: str, data: bytes | None) -> StateFields:
    """(leader, leader_epoch, isr, controller_epoch)."""
    return _state_fields(_load(data, what), what)


def _state_fields(d: Any, what: str) -> StateFields:
    try:
        return (int(d["leader"]), int(d["leader_epoch"]), [int(r) for r in d["isr"]],
                int(d.get("controller_epoch", -1)))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise LayoutError(f"{what}: {e}") from None


def encode_state_change(topic: str, partition: int, zk_version: int, state: bytes) -> bytes:
    """A state change notification: the partition, the state znode's version after the
    write, and the state written (TopicPartitionStateZNode)."""
    return _dump({"version": 1, "topic": topic, "partition": partition,
                  "zk_version": zk_version, "state": json.loads(state)})


def decode_state_change(data: bytes | None) -> tuple[str, int, int, bytes]:
    """(topic, partition, zk_version, state bytes) of a state change notification."""
    d = _load(data, "state change")
    try:
        return (str(d["topic"]), int(d["partition"]), int(d["zk_version"]),
                _dump(dict(d["state"])))
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"state change: {e}") from None


def encode_state_changes(changes: list[tuple[str, int, int, bytes]]) -> bytes:
    """One notification for the states a controller wrote in one transaction:
    ``{"version": 1, "changes": [<as encode_state_change>, ...]}``. The states (compact
    JSON from ``encode_state``) go in as they are, not parsed to be encoded again: the
    bytes are those of encoding the parsed document (a controller writes 30,000 in a
    failover of 10,000 partitions)."""
    return b'{"version":1,"changes":[%s]}' % b",".join(
        b'{"topic":%s,"partition":%d,"zk_version":%d,"state":%s}' % (_dump(t), p, v, state)
        for t, p, v, state in changes)


def decode_state_changes(data: bytes | None) -> list[tuple[str, int, int, bytes]]:
    """Every (topic, partition, zk_version, state bytes) of a notification, one change
    (``encode_state_change``) or several (``encode_state_changes``)."""
    d = _load(data, "state change")
    if "changes" not in d:
        return [decode_state_change(data)]
    try:
        return [(str(c["topic"]), int(c["partition"]), int(c["zk_version"]),
                 _dump(dict(c["state"]))) for c in d["changes"]]
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"state change: {e}") from None


def read_state_changes(data: bytes | None
                       ) -> list[tuple[str, int, int, StateFields | LayoutError]]:
    """``decode_state_changes`` with each state read into its fields (as
    ``decode_state`` reads a state znode) rather than encoded back to bytes to be parsed
    again: a broker reads 20,000 of them after a failover (bench/cluster_bench.py
    --scale). A malformed state is its LayoutError, in its place."""
    d = _load(data, "state change")
    items = d["changes"] if isinstance(d, dict) and "changes" in d else [d]
    out: list[tuple[str, int, int, StateFields | LayoutError]] = []
    try:
        for c in items:
            topic, p = str(c["topic"]), int(c["partition"])
            what = f"state of {topic}-{p}"
            try:
                fields: StateFields | LayoutError = _state_fields(c["state"], what)
            except LayoutError as e:
                fields = e
            out.append((topic, p, int(c["zk_version"]), fields))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise LayoutError(f"state change: {e}") from None
    return out


def decode_purged(data: bytes | None) -> int:
    """The highest state change sequence number removed (-1: none)."""
    try:
        return int(data.decode()) if data else -1
    except (UnicodeDecodeError, ValueError):
        return -1


def encode_config(configs: dict[str, str]) -> bytes:
    return _dump({"version": 1, "config": dict(sorted(configs.items()))})


def decode_config(name: str, data: bytes | None) -> dict[str, str]:
    if not data:  # None, or a parent made by a recursive create (users/<u>/clients/<c>)
        return {}
    d = _load(data, f"config of {name}")
    try:
        return {str(k): str(v) for k, v in dict(d.get("config") or {}).items()}
    except (TypeError, ValueError, AttributeError) as e:
        raise LayoutError(f"config of {name}: {e}") from None


# ---------------------------------------------------------------- controller, cluster
def encode_controller(broker_id: int, now_ms: int) -> bytes:
    return _dump({"version": 1, "brokerid": broker_id, "timestamp": str(now_ms)})


def decode_controller(data: bytes | None) -> int:
    if not data:
        return -1
    d = _load(data, "controller")
    try:
        return int(d["brokerid"])
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"controller: {e}") from None


def decode_controller_epoch(data: bytes | None) -> int:
    try:
        return int((data or b"0").decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise LayoutError(f"controller epoch: {e}") from None


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dump({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes | None) -> str:
    d = _load(data, "cluster id")
    try:
        return str(d["id"])
    except (KeyError, TypeError) as e:
        raise LayoutError(f"cluster id: {e}") from None


def encode_producer_id_block(broker_id: int, start: int, end: int) -> bytes:
    return _dump({"version": 1, "broker": broker_id, "block_start": str(start),
                  "block_end": str(end)})


def decode_producer_id_block(data: bytes | None) -> int:
    """The block's end (last id handed out), -1 if none yet."""
    if not data:
        return -1
    d = _load(data, "producer id block")
    try:
        return int(d["block_end"])
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"producer id block: {e}") from None


def encode_partition_list(key: str, items: list[dict[str, Any]]) -> bytes:
    return _dump({"version": 1, key: items})


def decode_reassignment(data: bytes | None) -> list[tuple[str, int, list[int]]]:
    if not data:
        return []
    d = _load(data, "reassign_partitions")
    try:
        return [(str(p["topic"]), int(p["partition"]), [int(r) for r in p["replicas"]])
                for p in d.get("partitions") or []]
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"reassign_partitions: {e}") from None


def decode_preferred(data: bytes | None) -> list[tuple[str, int]]:
    if not data:
        return []
    d = _load(data, "preferred_replica_election")
    try:
        return [(str(p["topic"]), int(p["partition"])) for p in d.get("partitions") or []]
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"preferred_replica_election: {e}") from None


# ---------------------------------------------------------------- ACLs (AclAuthorizer)
# /kafka-acl/<ResourceType>/<name>: a literal pattern's ACLs;
# /kafka-acl-extended/prefixed/<ResourceType>/<name>: a prefixed pattern's; each
# {"version":1,"acls":[{"principal","permissionType","operation","host"}]}. A change is
# announced by a sequential node: /kafka-acl-changes/acl_changes_N holding "Type:name"
# (literal), /kafka-acl-extended-changes/acl_changes_N holding {"version":1,
# "resourceType","name","patternType"} (prefixed); every broker re-reads the named
# resource (ZkAclChangeStore, ZkNodeChangeNotificationListener).
ACL_LITERAL = "/kafka-acl"
ACL_EXTENDED = "/kafka-acl-extended/prefixed"
ACL_CHANGES = "/kafka-acl-changes"
ACL_EXTENDED_CHANGES = "/kafka-acl-extended-changes"
ACL_CHANGE_PREFIX = "acl_changes_"
CONFIG_USERS = "/config/users"
CONFIG_CHANGES = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
SECURITY_PATHS = (ACL_LITERAL, ACL_EXTENDED, ACL_CHANGES, ACL_EXTENDED_CHANGES, CONFIG_USERS,
                  CONFIG_CHANGES)
_TYPE_BY_NAME = {v: k for k, v in acl.RESOURCE_TYPE_NAMES.items()}
_OP_BY_NAME = {v: k for k, v in acl.OPERATION_NAMES.items()}
_PERM_BY_NAME = {v: k for k, v in acl.PERMISSION_NAMES.items()}


def acl_root(pattern_type: acl.PatternType) -> str:
    return ACL_LITERAL if pattern_type is acl.PatternType.LITERAL else ACL_EXTENDED


def acl_path(p: acl.ResourcePattern) -> str:
    return f"{acl_root(p.pattern_type)}/{acl.RESOURCE_TYPE_NAMES[p.resource_type]}/{p.name}"


def acl_pattern(pattern_type: acl.PatternType, type_name: str, name: str
                ) -> acl.ResourcePattern:
    rt = _TYPE_BY_NAME.get(type_name)
    if rt is None:
        raise LayoutError(f"unknown ACL resource type {type_name!r}")
    return acl.ResourcePattern(rt, name, pattern_type)


def encode_acls(entries: frozenset[acl.AccessControlEntry] | set[acl.AccessControlEntry]
                ) -> bytes:
    return _dump({"version": 1, "acls": [
        {"principal": e.principal, "permissionType": acl.PERMISSION_NAMES[e.permission_type],
         "operation": acl.OPERATION_NAMES[e.operation], "host": e.host}
        for e in sorted(entries)]})


def decode_acls(what: str, data: bytes | None) -> frozenset[acl.AccessControlEntry]:
    if not data:
        return frozenset()
    d = _load(data, what)
    try:
        return frozenset(
            acl.AccessControlEntry(str(a["principal"]), str(a["host"]),
                                   _OP_BY_NAME[a["operation"]],
                                   _PERM_BY_NAME[a["permissionType"]])
            for a in d.get("acls") or [])
    except (KeyError, TypeError, AttributeError) as e:
        raise LayoutError(f"{what}: {e!r}") from None


def encode_acl_change(p: acl.ResourcePattern) -> bytes:
    type_name = acl.RESOURCE_TYPE_NAMES[p.resource_type]
    if p.pattern_type is acl.PatternType.LITERAL:
        return f"{type_name}:{p.name}".encode()
    return _dump({"version": 1, "resourceType": type_name, "name": p.name,
                  "patternType": p.pattern_type.name})


def decode_acl_change(extended: bool, data: bytes | None) -> acl.ResourcePattern:
    if not data:
        raise LayoutError("ACL change notification: no data")
    if not extended:
        try:
            type_name, sep, name = data.decode().partition(":")
        except UnicodeDecodeError as e:
            raise LayoutError(f"ACL change notification: {e}") from None
        if not sep:
            raise LayoutError(f"ACL change notification: {data!r} is not Type:name")
        return acl_pattern(acl.PatternType.LITERAL, type_name, name)
    d = _load(data, "ACL change notification")
    try:
        pt = acl.PatternType[str(d["patternType"]).upper()]
        return acl_pattern(pt, str(d["resourceType"]), str(d["name"]))
    except (KeyError, TypeError, AttributeError) as e:
        raise LayoutError(f"ACL change notification: {e!r}") from None


# ---------------------------------------------------------------- users (SCRAM)
def sanitize(name: str) -> str:
    """Kafka's ``Sanitizer.sanitize``: a user name as a znode name (URL-encoded)."""
    return urllib.parse.quote(name, safe="")


def desanitize(name: str) -> str:
    return urllib.parse.unquote(name)


def user_path(user: str) -> str:
    return f"{CONFIG_USERS}/{sanitize(user)}"


def encode_user_change(user: str) -> bytes:
    """A ``/config/changes/config_change_N`` node's data (version 2)."""
    return _dump({"version": 2, "entity_path": f"users/{sanitize(user)}"})


def decode_config_change(data: bytes | None) -> str:
    """The entity path a config change names (``users/alice``, ``clients/app``,
    ``users/alice/clients/app``, ``ips/1.2.3.4``, ``topics/t``): version 2's
    ``entity_path``, version 1's ``entity_type``/``entity_name``."""
    d = _load(data, "config change notification")
    try:
        return str(d["entity_path"]) if int(d.get("version", 2)) == 2 else \
            f"{d['entity_type']}/{d['entity_name']}"
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise LayoutError(f"config change notification: {e!r}") from None


def decode_user_change(data: bytes | None) -> str | None:
    """The user a config change names, None for any other entity."""
    kind, _, name = decode_config_change(data).partition("/")
    return desanitize(name) if kind == "users" and name and "/" not in name else None


# ---------------------------------------------------------------- client quotas
# /config/users/<user>, /config/users/<user>/clients/<client-id>, /config/clients/<client-id>,
# /config/ips/<ip> (names sanitized, <default> for the default entity): {"version":1,
# "config":{"producer_byte_rate":"1048576",...}}; a user's znode also holds its SCRAM
# credentials. A change is announced on /config/changes with {"version":2,
# "entity_path":"users/<user>/clients/<client-id>"} (Kafka's ZkData/ConfigEntityChangeNotification).
CONFIG_CLIENTS = "/config/clients"
CONFIG_IPS = "/config/ips"
QUOTA_PATHS = (CONFIG_CLIENTS, CONFIG_IPS)


def quota_path(entity_path: str) -> str:
    return f"/config/{entity_path}"


# ---------------------------------------------------------------- entity configs (issue 27)
# Dynamic broker configs: /config/brokers/<id> and /config/brokers/<default> (Kafka's
# DynamicBrokerConfig), group configs: /config/groups/<group> (name sanitized), each
# {"version":1,"config":{...}}, announced on /config/changes as "brokers/<id>",
# "brokers/<default>", "groups/<group>".
CONFIG_BROKERS = "/config/brokers"
CONFIG_GROUPS = "/config/groups"
ENTITY_CONFIG_PATHS = (CONFIG_BROKERS, CONFIG_GROUPS)
DEFAULT_ENTITY = "<default>"


def broker_entity(broker_id: int | None) -> str:
    """The entity path of a broker's dynamic configs (None: the cluster-wide default)."""
    return f"brokers/{DEFAULT_ENTITY if broker_id is None else broker_id}"


def group_entity(group: str) -> str:
    return f"groups/{sanitize(group)}"


def is_entity_config(entity_path: str) -> bool:
    kind, sep, name = entity_path.partition("/")
    return kind in ("brokers", "groups") and bool(sep) and bool(name) and "/" not in name


def encode_entity_change(entity_path: str) -> bytes:
    return _dump({"version": 2, "entity_path": entity_path})


def sequence_number(node: str) -> int:
    """The counter of a sequential node name (acl_changes_0000000012 -> 12), -1 if none."""
    digits = node[-10:]
    return int(digits) if digits.isdigit() else -1
