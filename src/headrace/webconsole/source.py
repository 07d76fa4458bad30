"""What the web console knows about a cluster, asked over the Kafka protocol: confluent-kafka's
AdminClient (Metadata, ListOffsets, the group APIs, CreateTopics, DescribeConfigs), a
consumer for the message browser, and headrace's wire client for DescribeLogDirs (sizes on
disk), which the AdminClient lacks.

Every method blocks (librdkafka calls and sockets) and is bounded by ``timeout_s``: the
server runs them in worker threads, never on its event loop. librdkafka's client handles
are thread-safe; the message browser takes a consumer of its own per request. Errors are
:mod:`headrace.webconsole.model`'s ``ApiError`` subclasses, never ``sys.exit`` (the CLI's
helpers in ``admin_cli`` exit; only their pure parts are shared here).
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from headrace.admin_cli import AUTH_CODES, UNREACHABLE_CODES, log_dir_sizes, state_name
from headrace.admin_wire import SecurityError, partition_sizes
from headrace.admin_wire import list_offsets as _list_offsets
from headrace.console import json_bytes
from headrace.webconsole.model import (
    ApiError,
    AuthFailed,
    BadRequest,
    BrokerRefused,
    Conflict,
    MessageQuery,
    NewTopicRequest,
    NotFound,
    Unavailable,
    merge_group_answers,
    partition_lag,
    total_lag,
)

T = TypeVar("T")
P = ParamSpec("P")

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
MAX_SAMPLED_GROUPS = 200  # groups whose lag is sampled each interval (the first by name)
MAX_VALUE_BYTES = 64 * 1024  # a key, value or header value longer than this is cut
MAX_RESPONSE_BYTES = 8 * 1024 * 1024  # the message browser stops reading past this

_NOT_FOUND = ("UNKNOWN_TOPIC_OR_PART", "GROUP_ID_NOT_FOUND", "_UNKNOWN_TOPIC",
              "_UNKNOWN_PARTITION")
_BAD_INPUT = ("INVALID_TOPIC_EXCEPTION", "INVALID_PARTITIONS", "INVALID_REPLICATION_FACTOR",
              "INVALID_CONFIG", "POLICY_VIOLATION", "INVALID_REQUEST", "UNKNOWN_TOPIC_OR_PART",
              "INVALID_REPLICA_ASSIGNMENT", "_INVALID_ARG")


def _error(err: Any, what: str, input_error: bool = False) -> ApiError:
    """A librdkafka error (KafkaError or KafkaException) as an ApiError."""
    if hasattr(err, "args") and err.args and hasattr(err.args[0], "name"):
        err = err.args[0]
    name = err.name() if hasattr(err, "name") else type(err).__name__
    text = err.str() if hasattr(err, "str") else str(err)
    if name in UNREACHABLE_CODES or name == "_TIMED_OUT":
        return Unavailable(f"{what}: no broker answered ({text})")
    if name in AUTH_CODES:
        return AuthFailed(f"{what}: authentication failed: {text}")
    if name == "TOPIC_ALREADY_EXISTS":
        return Conflict(f"{what}: {text}")
    if input_error and name in _BAD_INPUT:
        return BadRequest(f"{what}: {text}")
    if name in _NOT_FOUND:
        return NotFound(f"{what}: {text}")
    return BrokerRefused(f"{what}: {text or name}")


def _kafka_errors(method: Callable[P, T]) -> Callable[P, T]:
    """A librdkafka error that escapes a public method (raised at once rather than through
    a future) becomes an ApiError like the others."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        from confluent_kafka import KafkaException

        try:
            return method(*args, **kwargs)
        except KafkaException as e:
            raise _error(e, method.__name__) from None

    return wrapper


class ClusterSource:
    """Blocking reads and writes of one cluster, for the console's worker threads."""

    def __init__(self, bootstrap: str, client_config: dict[str, str], timeout_s: float = 5.0,
                 quiet: bool = True) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.config: dict[str, Any] = {
            **client_config, "bootstrap.servers": bootstrap,
            "socket.timeout.ms": int(timeout_s * 1000),
            **({"log_level": 0} if quiet else {})}
        self.client_config = client_config
        self.admin: Any = AdminClient(dict(self.config))
        # a sample asks every broker at once, each bounded by broker_timeout_s
        self.broker_timeout_s = min(timeout_s, 2.0)
        self._broker_pool = ThreadPoolExecutor(16, thread_name_prefix="headrace-sample")
        self._known_groups: dict[str, dict[str, Any]] = {}

    def check_connection(self) -> None:
        """Connect to the first bootstrap address with headrace's wire client, TLS and
        SASL included: librdkafka reports a refused password or certificate only as a
        transport failure."""
        from headrace.admin_wire import AdminConnection, SecurityError
        from headrace.cli_support import parse_bootstrap

        host, port = parse_bootstrap(self.bootstrap)[0]
        try:
            AdminConnection(host, port, self.timeout_s, self.client_config).close()
        except SecurityError as e:
            raise AuthFailed(str(e)) from None
        except OSError as e:
            raise Unavailable(f"cannot reach a broker at {host}:{port}: "
                              f"{e.strerror or e or 'timed out'}") from None

    # ------------------------------------------------------------ helpers

    def _wait(self, fut: Future[T], what: str, input_error: bool = False) -> T:
        from confluent_kafka import KafkaException

        try:
            return fut.result(timeout=self.timeout_s + 1)
        except KafkaException as e:
            raise _error(e, what, input_error) from None
        except TimeoutError:
            raise Unavailable(f"{what}: no answer within {self.timeout_s:.0f} s") from None

    def _call(self, fn: Callable[[], T], what: str) -> T:
        from confluent_kafka import KafkaException

        try:
            return fn()
        except KafkaException as e:
            raise _error(e, what) from None

    def metadata(self) -> Any:
        """Metadata of every topic (asking for all creates none)."""
        return self._call(lambda: self.admin.list_topics(timeout=self.timeout_s), "metadata")

    def _describe(self, topic: str) -> Any:
        """One topic's partitions (DescribeTopics: Metadata that never creates a topic,
        whatever auto.create.topics.enable says)."""
        from confluent_kafka import TopicCollection

        fut = self.admin.describe_topics(TopicCollection([topic]),
                                         request_timeout=self.timeout_s)[topic]
        try:
            return self._wait(fut, f"topic {topic!r}")
        except NotFound:
            raise NotFound(f"topic {topic!r} does not exist") from None

    def _offsets(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(log start offset, high watermark) per partition; -1 where a leader did not
        answer."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        out = {tp: [-1, -1] for tp in tps}
        if not tps:
            return {}
        spec: Any = OffsetSpec
        for i, which in enumerate((spec.earliest(), spec.latest())):
            futs = self.admin.list_offsets({TopicPartition(t, p): which for t, p in tps},
                                           request_timeout=self.timeout_s)
            for tp, fut in futs.items():
                # -1 stays where a partition has no leader right now
                with contextlib.suppress(NotFound, BrokerRefused):
                    out[(tp.topic, tp.partition)][i] = self._wait(fut, "list offsets").offset
        return {tp: (v[0], v[1]) for tp, v in out.items()}

    def _sizes(self, brokers: list[Any], wanted: dict[str, list[int]]
               ) -> dict[tuple[str, int, int], int]:
        if not wanted:
            return {}
        return log_dir_sizes(brokers, wanted, self.timeout_s, self.client_config)

    # ------------------------------------------------------------ the periodic sample

    @_kafka_errors
    def snapshot(self) -> dict[str, Any]:
        """The cluster, every topic with its offsets and size, every group with its total
        lag: what the overview, topic and group tables show and the charts sample.

        Metadata comes from librdkafka; everything else is asked of each broker at once
        (one thread per broker, headrace's wire client, each bounded by
        ``broker_timeout_s``): offsets of the partitions it leads, sizes on its disk, the
        groups it coordinates. A broker that does not answer in time costs only what it
        alone would have said: its partitions' offsets are unknown (-1) and its groups
        show the outage (:func:`model.merge_group_answers`). No librdkafka request is
        left in flight when a sample ends (issue 26: the admin client's group requests
        waiting on a dead coordinator aborted the process when it came back)."""
        now_ms = int(time.time() * 1000)
        md = self.metadata()
        brokers = sorted(md.brokers.values(), key=lambda b: b.id)
        parts = {name: sorted(t.partitions) for name, t in md.topics.items() if t.error is None}
        led: dict[int, list[tuple[str, int]]] = {}
        for name, ps in parts.items():
            for p in ps:
                leader = md.topics[name].partitions[p].leader
                if leader >= 0:
                    led.setdefault(leader, []).append((name, p))
        answers = self._ask_brokers(brokers, led, parts)
        offsets: dict[tuple[str, int], tuple[int, int]] = {}
        sizes: dict[tuple[str, int, int], int] = {}
        group_answers: dict[int, list[dict[str, Any]] | str] = {}
        for b in brokers:
            answer = answers[b.id]
            if isinstance(answer, str):
                group_answers[b.id] = answer
                continue
            offsets.update(answer.offsets)
            sizes.update(answer.sizes)
            group_answers[b.id] = answer.groups
        topics = []
        for name in sorted(parts):
            t = md.topics[name]
            low_high = [offsets.get((name, p), (-1, -1)) for p in parts[name]]
            leaders = [t.partitions[p].leader for p in parts[name]]
            size = [sizes.get((name, p, leader)) for p, leader in zip(parts[name], leaders,
                                                                     strict=True)]
            topics.append({
                "name": name, "internal": name in INTERNAL_TOPICS,
                "partitions": len(parts[name]),
                "replication_factor": max((len(t.partitions[p].replicas)
                                           for p in parts[name]), default=0),
                "under_replicated": sum(1 for p in parts[name]
                                        if len(t.partitions[p].isrs)
                                        < len(t.partitions[p].replicas)),
                "offline": sum(1 for leader in leaders if leader < 0),
                "records": sum(max(0, h - lo) for lo, h in low_high if lo >= 0 and h >= 0),
                "high_watermark_sum": sum(h for _, h in low_high if h >= 0),
                "size_bytes": None if any(s is None for s in size) else sum(
                    s for s in size if s is not None),
            })
        highs = {tp: h for tp, (_, h) in offsets.items() if h >= 0}
        for docs in group_answers.values():  # lag against this sample's high watermarks
            for doc in docs if isinstance(docs, list) else ():
                doc["lag"] = total_lag(doc.pop("committed"), highs)
        merged = merge_group_answers(group_answers, self._known_groups, now_ms)
        self._known_groups = merged
        per_topic: dict[str, dict[int, int]] = {}
        for (name, p), h in highs.items():
            per_topic.setdefault(name, {})[p] = h
        return {"time_ms": now_ms, "cluster": self._cluster(md, brokers), "topics": topics,
                "groups": list(merged.values())[:MAX_SAMPLED_GROUPS],
                "groups_total": len(merged),
                "high_watermarks": {t["name"]: per_topic.get(t["name"], {})
                                    for t in topics if not t["internal"]}}

    def _cluster(self, md: Any, brokers: list[Any]) -> dict[str, Any]:
        return {"cluster_id": md.cluster_id, "controller_id": md.controller_id,
                "bootstrap": self.bootstrap,
                "brokers": [{"id": b.id, "host": b.host, "port": b.port,
                             "controller": b.id == md.controller_id} for b in brokers]}

    def _ask_brokers(self, brokers: list[Any], led: dict[int, list[tuple[str, int]]],
                     parts: dict[str, list[int]]) -> dict[int, BrokerAnswer | str]:
        """Every broker's answer at once; a broker not done by the deadline is left
        behind (its thread ends by its socket timeout) with a reason instead."""
        futs = {b.id: self._broker_pool.submit(self.ask_broker, b, led.get(b.id, []), parts)
                for b in brokers}
        deadline = self.broker_timeout_s * BROKER_ROUND_TRIPS + 0.5
        done, _ = wait_futures(futs.values(), timeout=deadline)
        out: dict[int, BrokerAnswer | str] = {}
        for broker_id, fut in futs.items():
            if fut not in done:
                out[broker_id] = f"no answer within {deadline:.0f} s"
                continue
            try:
                out[broker_id] = fut.result()
            except SecurityError as e:
                out[broker_id] = f"authentication failed: {e}"
            except Exception as e:  # refused, reset, timed out, or bytes we cannot read
                out[broker_id] = (getattr(e, "strerror", None) or str(e)
                                  or type(e).__name__)
        return out

    def ask_broker(self, node: Any, led: list[tuple[str, int]],
                   parts: dict[str, list[int]]) -> BrokerAnswer:
        """One broker's part of a sample, over one connection: the log start offset and
        high watermark of the partitions it leads, its log sizes, and the groups it
        coordinates (ListGroups answers only those) with their committed offsets."""
        from headrace.admin_wire import AdminConnection

        conn = AdminConnection(node.host, node.port, self.broker_timeout_s,
                               self.client_config)
        try:
            answer = BrokerAnswer()
            if led:
                answer.offsets = _list_offsets(conn, led)
            if parts:
                for (name, index), size in partition_sizes(conn, parts).items():
                    answer.sizes[(name, index, node.id)] = size
            answer.groups = _coordinated_groups(conn)
            return answer
        finally:
            conn.close()

    # ------------------------------------------------------------ one topic, one group

    @_kafka_errors
    def topic(self, name: str) -> dict[str, Any]:
        """A topic's partitions (leader, replicas, ISR, offsets, size) and its config
        overrides."""
        from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

        desc = self._describe(name)
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        try:
            cfg = self._wait(self.admin.describe_configs([res])[res], f"topic {name!r} configs")
            overrides = {k: v.value for k, v in sorted(cfg.items()) if not v.is_default}
        except (NotFound, BrokerRefused):
            overrides = {}
        ids = sorted(p.id for p in desc.partitions)
        offsets = self._offsets([(name, p) for p in ids])
        nodes = {n.id: n for p in desc.partitions for n in [*p.replicas, p.leader]
                 if n is not None}
        sizes = self._sizes(sorted(nodes.values(), key=lambda n: n.id), {name: ids})
        partitions = []
        for p in sorted(desc.partitions, key=lambda p: p.id):
            leader = p.leader.id if p.leader is not None else -1
            low, high = offsets.get((name, p.id), (-1, -1))
            partitions.append({
                "partition": p.id, "leader": leader,
                "replicas": [n.id for n in p.replicas], "isr": [n.id for n in p.isr],
                "log_start_offset": low, "high_watermark": high,
                "records": max(0, high - low) if low >= 0 and high >= 0 else None,
                "size_bytes": sizes.get((name, p.id, leader))})
        return {"name": name, "internal": bool(desc.is_internal), "configs": overrides,
                "partitions": partitions}

    @_kafka_errors
    def group(self, group: str) -> dict[str, Any]:
        """A group's state, members with their assignments, and per partition the
        committed offset, the high watermark and the lag (a share group's page:
        ``share_group``)."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        shared = self.share_group(group)
        if shared is not None:
            return shared

        desc = self._wait(self.admin.describe_consumer_groups(
            [group], request_timeout=self.timeout_s)[group], f"group {group!r}")
        state = state_name(desc.state)
        res = self._wait(self.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=self.timeout_s)[group],
            f"group {group!r} offsets")
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in res.topic_partitions or [] if tp.error is None}
        if state == "DEAD" and not desc.members and not committed:
            raise NotFound(f"consumer group {group!r} does not exist")
        owner: dict[tuple[str, int], str] = {}
        members = []
        for m in desc.members:
            assigned = sorted((tp.topic, tp.partition) for tp in
                              ((m.assignment.topic_partitions if m.assignment else None) or []))
            for tp in assigned:
                owner[tp] = m.member_id
            members.append({"member_id": m.member_id, "client_id": m.client_id,
                            "host": m.host, "group_instance_id": m.group_instance_id,
                            "assignment": [{"topic": t, "partition": p} for t, p in assigned]})
        tps = sorted(set(committed) | set(owner))
        offsets = self._offsets(tps)
        partitions = []
        for tp in tps:
            current = committed.get(tp, -1)
            high = offsets.get(tp, (-1, -1))[1]
            partitions.append({
                "topic": tp[0], "partition": tp[1],
                "committed_offset": current if current >= 0 else None,
                "high_watermark": high if high >= 0 else None,
                "lag": partition_lag(current, high) if high >= 0 else None,
                "member_id": owner.get(tp)})
        return {"group": group, "state": state, "protocol": desc.partition_assignor or None,
                "coordinator": desc.coordinator.id if desc.coordinator else None,
                "members": members, "partitions": partitions,
                "total_lag": sum(p["lag"] or 0 for p in partitions)}

    def _wire(self, host: str, port: int) -> Any:
        from headrace.admin_wire import AdminConnection

        try:
            return AdminConnection(host, port, self.timeout_s, self.client_config)
        except SecurityError as e:
            raise AuthFailed(str(e)) from None
        except OSError as e:
            raise Unavailable(f"cannot reach broker {host}:{port}: "
                              f"{e.strerror or e or 'timed out'}") from None

    def share_group(self, group: str) -> dict[str, Any] | None:
        """A share group's page (KIP-932), or None when ``group`` is no share group: its
        members (ShareGroupDescribe) and per partition the share-partition start offset
        (DescribeShareGroupOffsets), the high watermark, the lag (high watermark minus the
        start offset minus the records done past it), and from the share coordinator's
        stored state (ReadShareGroupState at leader epoch -1, which changes nothing) the
        records in flight past the start offset and those archived (rejected, or
        delivered too often)."""
        from headrace.cli_support import parse_bootstrap

        try:
            host, port = parse_bootstrap(self.bootstrap)[0]
            conn = self._wire(host, port)
            try:
                found = conn.request(10, 4, {"key_type": 0, "coordinator_keys": [group]})
            finally:
                conn.close()
            c = found.coordinators[0]
            if c.error_code != 0:
                return None
            conn = self._wire(str(c.host), int(c.port))
            try:
                described = conn.request(77, 1, {"group_ids": [group],
                                                 "include_authorized_operations": False})
                (d,) = described.groups
                if d.error_code != 0:
                    return None
                offsets = conn.request(90, 1, {"groups": [{"group_id": group,
                                                           "topics": None}]})
            finally:
                conn.close()
        except (ConnectionError, OSError, ValueError):
            return None
        sharing: dict[tuple[str, int], list[str]] = {}
        members = []
        for m in d.members:
            assigned = sorted((str(t.topic_name), int(p)) for t in m.assignment.topic_partitions
                              for p in t.partitions)
            for tp in assigned:
                sharing.setdefault(tp, []).append(m.member_id)
            members.append({"member_id": m.member_id, "client_id": m.client_id,
                            "host": m.client_host, "group_instance_id": None,
                            "assignment": [{"topic": t, "partition": p} for t, p in assigned]})
        starts: dict[tuple[str, int], tuple[int, Any]] = {}
        for g in offsets.groups:
            for t in g.topics:
                for p in t.partitions:
                    if p.error_code == 0:
                        starts[(str(t.topic_name), int(p.partition_index))] = (
                            int(p.start_offset), t.topic_id)
        counts = self._share_counts(group, starts)
        tps = sorted(set(starts) | set(sharing))
        highs = self._offsets(tps)
        partitions = []
        for tp in tps:
            start = starts.get(tp, (-1, None))[0]
            high = highs.get(tp, (-1, -1))[1]
            in_flight, archived, done = counts.get(tp, (None, None, 0))
            lag = (max(0, high - start - done) if high >= 0 and start >= 0 else None)
            partitions.append({
                "topic": tp[0], "partition": tp[1],
                "committed_offset": start if start >= 0 else None,
                "high_watermark": high if high >= 0 else None, "lag": lag,
                "in_flight": in_flight, "archived": archived,
                "member_id": ", ".join(sharing.get(tp, [])) or None})
        return {"group": group, "type": "share", "state": _state_name(d.group_state),
                "protocol": d.assignor_name or None, "coordinator": None,
                "members": members, "partitions": partitions,
                "total_lag": sum(p["lag"] or 0 for p in partitions)}

    def _share_counts(self, group: str, starts: dict[tuple[str, int], tuple[int, Any]]
                      ) -> dict[tuple[str, int], tuple[int, int, int]]:
        """(in flight, archived, acknowledged or archived) past the start offset of each
        share-partition, from its stored state; left out where the share coordinator
        does not answer (or refuses: it needs CLUSTER_ACTION)."""
        from headrace.share.state import kafka_uuid_string

        keys = {f"{group}:{kafka_uuid_string(tid)}:{tp[1]}": (tp, tid)
                for tp, (_, tid) in starts.items() if tid is not None}
        if not keys:
            return {}
        out: dict[tuple[str, int], tuple[int, int, int]] = {}
        try:
            from headrace.cli_support import parse_bootstrap

            host, port = parse_bootstrap(self.bootstrap)[0]
            conn = self._wire(host, port)
            try:
                found = conn.request(10, 6, {"key_type": 2, "coordinator_keys": list(keys)})
            finally:
                conn.close()
            by_node: dict[tuple[str, int], list[tuple[tuple[str, int], Any]]] = {}
            for c in found.coordinators:
                if c.error_code == 0 and c.key in keys:
                    by_node.setdefault((str(c.host), int(c.port)), []).append(keys[c.key])
            for (h, p), entries in by_node.items():
                conn = self._wire(h, p)
                try:
                    by_topic: dict[Any, list[int]] = {}
                    for tp, tid in entries:
                        by_topic.setdefault(tid, []).append(tp[1])
                    resp = conn.request(84, 0, {"group_id": group, "topics": [
                        {"topic_id": tid, "partitions": [{"partition": i, "leader_epoch": -1}
                                                         for i in ps]}
                        for tid, ps in by_topic.items()]})
                finally:
                    conn.close()
                names = {tid: tp[0] for tp, tid in entries}
                for r in resp.results:
                    for rp in r.partitions:
                        if rp.error_code != 0:
                            continue
                        start = int(rp.start_offset)
                        archived = sum(b.last_offset - b.first_offset + 1
                                       for b in rp.state_batches if b.delivery_state == 4)
                        done = archived + sum(b.last_offset - b.first_offset + 1
                                              for b in rp.state_batches
                                              if b.delivery_state == 2)
                        end = max((int(b.last_offset) + 1 for b in rp.state_batches),
                                  default=start)
                        out[(names[r.topic_id], int(rp.partition))] = (
                            max(0, end - start - done), archived, done)
        except (ConnectionError, OSError, ValueError, ApiError):
            return out
        return out

    # ------------------------------------------------------------ messages

    @_kafka_errors
    def messages(self, q: MessageQuery) -> dict[str, Any]:
        """Up to ``q.limit`` records of one partition, read by a consumer of its own that
        joins no group and commits nothing."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        partitions = {p.id for p in self._describe(q.topic).partitions}
        if q.partition not in partitions:
            raise NotFound(f"topic {q.topic!r} has no partition {q.partition} "
                           f"(it has {len(partitions)})")
        consumer = Consumer({**self.config, "group.id": "headrace-console",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "auto.offset.reset": "earliest",
                             "fetch.wait.max.ms": 100})
        try:
            tp = TopicPartition(q.topic, q.partition)
            low, high = self._call(lambda: consumer.get_watermark_offsets(
                tp, timeout=self.timeout_s), "watermarks")
            start = self._start(consumer, q, low, high)
            records = self._read(consumer, q, start, high) if start < high else []
        except KafkaException as e:
            raise _error(e, f"{q.topic}-{q.partition}") from None
        finally:
            consumer.close()
        return {"topic": q.topic, "partition": q.partition, "log_start_offset": low,
                "high_watermark": high, "start_offset": start, "records": records}

    def _start(self, consumer: Any, q: MessageQuery, low: int, high: int) -> int:
        from confluent_kafka import TopicPartition

        if q.offset is not None:
            return max(q.offset, low)
        if q.timestamp_ms is not None:
            (found,) = consumer.offsets_for_times(
                [TopicPartition(q.topic, q.partition, q.timestamp_ms)], timeout=self.timeout_s)
            return int(found.offset) if found.offset >= 0 else high  # none at or after it
        return max(low, high - q.limit)

    def _read(self, consumer: Any, q: MessageQuery, start: int, high: int
              ) -> list[dict[str, Any]]:
        from confluent_kafka import KafkaError, TopicPartition

        consumer.assign([TopicPartition(q.topic, q.partition, start)])
        records: list[dict[str, Any]] = []
        size = 0
        deadline = time.monotonic() + self.timeout_s
        while len(records) < q.limit and size < MAX_RESPONSE_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            batch = consumer.consume(num_messages=q.limit - len(records),
                                     timeout=min(left, 0.5))
            done = False
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        continue
                    raise _error(err, f"{q.topic}-{q.partition}")
                doc = _record_doc(m)
                size += doc.pop("_size")
                records.append(doc)
                done = done or m.offset() + 1 >= high
            if done or len(records) >= q.limit:
                break
        return records[:q.limit]

    # ------------------------------------------------------------ topic creation

    @_kafka_errors
    def create_topic(self, req: NewTopicRequest) -> None:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        nt = NewTopic(req.name,
                      num_partitions=-1 if req.partitions is None else req.partitions,
                      replication_factor=(-1 if req.replication_factor is None
                                          else req.replication_factor),
                      config=req.configs)
        fut = self.admin.create_topics([nt], operation_timeout=self.timeout_s,
                                       request_timeout=self.timeout_s)[req.name]
        self._wait(fut, f"create topic {req.name!r}", input_error=True)


def _bounded_bytes(b: bytes | None, out: dict[str, Any], name: str) -> int:
    """``name`` as text (or base64 with ``name_encoding``), cut at MAX_VALUE_BYTES with
    ``name_truncated`` and ``name_size`` set; returns the bytes kept."""
    if b is not None and len(b) > MAX_VALUE_BYTES:
        out[name + "_truncated"] = True
        out[name + "_size"] = len(b)
        b = b[:MAX_VALUE_BYTES]
    json_bytes(b, out, name)
    return 0 if b is None else len(b)


def _record_doc(m: Any) -> dict[str, Any]:
    ts_type, ts = m.timestamp()
    doc: dict[str, Any] = {"offset": m.offset(), "timestamp": ts if ts_type else None,
                           "timestamp_type": {1: "create", 2: "log_append"}.get(ts_type)}
    size = _bounded_bytes(m.key(), doc, "key") + _bounded_bytes(m.value(), doc, "value")
    headers = []
    for k, v in m.headers() or ():
        h: dict[str, Any] = {"key": k}
        size += len(k) + _bounded_bytes(v, h, "value")
        headers.append(h)
    doc["headers"] = headers
    doc["_size"] = size
    return doc


BROKER_ROUND_TRIPS = 6  # requests in one broker's part of a sample, at most


@dataclass
class BrokerAnswer:
    """What one broker said in one sample."""

    offsets: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    sizes: dict[tuple[str, int, int], int] = field(default_factory=dict)
    groups: list[dict[str, Any]] = field(default_factory=list)  # with "committed"


def _state_name(kafka_state: str) -> str:
    """Kafka's group state (``PreparingRebalance``) as the console shows states
    (``PREPARING_REBALANCE``, as librdkafka names them)."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", kafka_state).upper()


def _share_groups(conn: Any, ids: list[str]) -> list[dict[str, Any]]:
    """Share groups this broker coordinates (KIP-932): ShareGroupDescribe for their state
    and members, DescribeShareGroupOffsets for each share-partition's start offset, which
    the sample's lag is counted from (an upper bound: records acknowledged past it count
    as lag here; the group page subtracts them)."""
    described = conn.request(77, 1, {"group_ids": ids, "include_authorized_operations": False})
    offsets = conn.request(90, 1, {"groups": [{"group_id": g, "topics": None} for g in ids]})
    starts: dict[str, dict[tuple[str, int], int]] = {}
    for g in offsets.groups:
        starts[g.group_id] = {(str(t.topic_name), int(p.partition_index)): int(p.start_offset)
                              for t in g.topics for p in t.partitions
                              if p.error_code == 0 and p.start_offset >= 0}
    out = []
    for d in described.groups:
        if d.group_id not in ids:
            continue
        doc: dict[str, Any] = {
            "group": d.group_id, "type": "share", "state": _state_name(d.group_state),
            "members": len(d.members), "protocol": d.assignor_name or None,
            "topics": sorted({t for t, _ in starts.get(d.group_id, {})}),
            "committed": starts.get(d.group_id, {})}
        if d.error_code != 0:
            doc["error"] = f"ShareGroupDescribe: error {d.error_code}"
        out.append(doc)
    return out


def _coordinated_groups(conn: Any) -> list[dict[str, Any]]:
    """The groups this broker coordinates (ListGroups v4), described (DescribeGroups v5;
    ConsumerGroupDescribe v0 for KIP-848 groups) with their committed offsets
    (OffsetFetch v8), at most MAX_SAMPLED_GROUPS (the first by id)."""
    listing = conn.request(16, 5, {"states_filter": [], "types_filter": []})
    if listing.error_code != 0:
        raise ConnectionError(f"ListGroups: error {listing.error_code} (e.g. its "
                              "coordinator is still loading)")
    chosen = sorted(listing.groups, key=lambda g: g.group_id)[:MAX_SAMPLED_GROUPS]
    shares = [g.group_id for g in chosen if g.group_type == "share"]
    ids = [g.group_id for g in chosen if g.group_type != "share"]
    out = _share_groups(conn, shares) if shares else []
    if not ids:
        return out
    described = conn.request(15, 5, {"groups": ids, "include_authorized_operations": False})
    fetched = conn.request(9, 8, {"groups": [{"group_id": g, "topics": None} for g in ids],
                                  "require_stable": False})
    committed: dict[str, dict[tuple[str, int], int]] = {}
    for g in fetched.groups:
        committed[g.group_id] = {(t.name, p.partition_index): int(p.committed_offset)
                                 for t in g.topics for p in t.partitions
                                 if p.error_code == 0 and p.committed_offset >= 0}
    modern = []
    for d in described.groups:
        if d.group_id not in ids:
            continue
        doc: dict[str, Any] = {
            "group": d.group_id, "state": _state_name(d.group_state),
            "members": len(d.members), "protocol": d.protocol_data or None,
            "topics": sorted({t for t, _ in committed.get(d.group_id, {})}),
            "committed": committed.get(d.group_id, {})}
        if d.error_code != 0:
            doc["error"] = f"DescribeGroups: error {d.error_code}"
        elif (d.protocol_type == "consumer" and not d.members
              and d.group_state not in ("Empty", "Dead")):
            modern.append(d.group_id)
        out.append(doc)
    if modern:  # KIP-848 groups: their members only ConsumerGroupDescribe shows
        with contextlib.suppress(Exception):  # a broker without it: member counts stay 0
            resp = conn.request(69, 0, {"group_ids": modern,
                                        "include_authorized_operations": False})
            by_id = {g.group_id: g for g in resp.groups if g.error_code == 0}
            for doc in out:
                g = by_id.get(doc["group"])
                if g is not None:
                    doc.update(members=len(g.members), protocol=g.assignor_name or None,
                               state=_state_name(g.group_state))
    return out
