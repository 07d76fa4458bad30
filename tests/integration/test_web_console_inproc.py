"""Fast twins of tests/integration/test_web_console.py (issue 13, the web console; issue 22
item 1): the console's own server (``headrace.webconsole.server.serve``, the code
``headrace console`` runs) in this test's event loop, against an in-process broker, its
JSON API read over real HTTP. No console process, no Chromium: the page's drawing stays
proven by the slow module; what the API answers, refuses and survives is proven here.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from headrace.broker.embedded import EmbeddedBroker
from headrace.webconsole.server import Console, serve
from headrace.webconsole.source import ClusterSource
from tests.inproc import InProcessBroker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path_factory.mktemp("console-inproc"),
                         {"num.partitions": "1"}) as b:
        yield b


@dataclass
class Served:
    console: Console
    host: str
    port: int

    def _call(self, method: str, path: str, body: bytes | None,
              headers: dict[str, str] | None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    async def api(self, path: str, body: bytes | None = None,
                  headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """GET (or POST with a body) over HTTP, off the loop the console serves on."""
        method = "GET" if body is None else "POST"
        return await asyncio.to_thread(self._call, method, path, body, headers)


@contextlib.asynccontextmanager
async def _serve(bootstrap: str) -> AsyncIterator[Served]:
    console = Console(ClusterSource(bootstrap, {}, timeout_s=2.0, quiet=True), 0.2)
    stop, listening = asyncio.Event(), asyncio.Event()
    url: list[str] = []

    def on_listening(u: str) -> None:
        url.append(u)
        listening.set()

    task = asyncio.create_task(serve(console, "127.0.0.1", 0, stop, on_listening))
    waiter = asyncio.create_task(listening.wait())
    await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # its error
    assert url, "the console did not listen within 30 s"
    port = int(url[0].rstrip("/").rsplit(":", 1)[1])
    try:
        yield Served(console, "127.0.0.1", port)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def served(broker: InProcessBroker) -> AsyncIterator[Served]:
    async with _serve(broker.bootstrap) as s:
        yield s


async def _until(what: str, check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(("path", "status", "words"), [
    ("/api/messages?topic=a%2Fb", 400, "may contain only"),
    ("/api/messages?topic=t&partition=-1", 400, "partition: must be between"),
    ("/api/messages?topic=t&limit=100000", 400, "limit: must be between 1 and 500"),
    ("/api/messages?topic=t&offset=abc", 400, "offset: expected an integer"),
    ("/api/messages?topic=t&offset=1&timestamp=2", 400, "either offset or timestamp"),
    ("/api/messages?topic=no-such-topic", 404, "does not exist"),
    ("/api/topics/no-such-topic", 404, "no-such-topic"),
    ("/api/topics/..", 400, "cannot be named"),
    ("/api/groups/no-such-group", 404, "does not exist"),
    ("/api/nothing-here", 404, "Not Found"),
    ("/static/../../etc/passwd", 404, ""),
])
async def test_bad_requests_are_json_errors(served: Served, path: str, status: int,
                                            words: str) -> None:
    got, doc = await served.api(path)
    assert got == status, (got, doc)
    assert isinstance(doc, dict) and words in doc["error"], doc


async def test_bad_posts_are_refused(served: Served) -> None:
    json_ = {"Content-Type": "application/json"}
    cases: list[tuple[bytes, dict[str, str], int, str]] = [
        (b"{not json", json_, 400, "not JSON"),
        (b'{"name": "ok", "partitions": 0}', json_, 400, "partitions: must be between"),
        (b'{"name": "ok", "partitions": true}', json_, 400, "expected an integer"),
        (b'{"name": "ok", "bogus": 1}', json_, 400, "unknown field"),
        (b'{"name": "ok", "configs": {"A B": "1"}}', json_, 400, "is not a config name"),
        (b"[]", json_, 400, "expected a JSON object"),
        (b'{"name": "ok"}', {"Content-Type": "text/plain"}, 400, "application/json"),
        (b'{"name": "ok"}', {**json_, "Origin": "http://evil.example"}, 403, "cross-origin"),
        (b'{"name": "' + b"x" * 70_000 + b'"}', json_, 413, ""),
    ]
    for body, headers, status, words in cases:
        got, doc = await served.api("/api/topics", body=body, headers=headers)
        assert got == status, (body[:40], got, doc)
        assert words in doc["error"], doc
    got, doc = await served.api("/api/cluster", headers={"Host": "rebind.example:80"})
    assert got == 400 and "Host" in doc["error"]
    _, topics = await served.api("/api/topics")
    assert "ok" not in [t["name"] for t in topics["topics"]]  # nothing refused was created


async def test_created_topic_and_its_records_are_shown(served: Served,
                                                      broker: InProcessBroker) -> None:
    """The form's POST creates the topic; the overview, topic view and message browser show
    what the clients see (twin of the overview, topics, create and browser tests)."""
    name = f"console-{uuid.uuid4().hex[:6]}"
    got, doc = await served.api("/api/topics", body=json.dumps(
        {"name": name, "partitions": 3}).encode(), headers={"Content-Type": "application/json"})
    assert (got, doc) == (201, {"created": name})
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        p.produce(name, key=b"k%d" % i, value=b"v%d" % i, partition=1,
                  timestamp=1_700_000_000_000 + i)
    assert p.flush(30) == 0

    async def listed() -> Any:
        _, topics = await served.api("/api/topics")
        return [t for t in topics["topics"] if t["name"] == name
                and t.get("high_watermark_sum") == 20]

    (row,) = await _until("the topic in the overview with its 20 records", listed)
    assert row["partitions"] == 3 and not row["internal"]
    got, cluster = await served.api("/api/cluster")
    assert got == 200 and cluster["error"] is None and len(cluster["brokers"]) == 1
    got, view = await served.api(f"/api/topics/{name}")
    assert got == 200 and len(view["partitions"]) == 3
    got, doc = await served.api(f"/api/messages?topic={name}&partition=1&limit=3")
    assert got == 200 and [r["offset"] for r in doc["records"]] == [17, 18, 19]  # newest
    assert [r["value"] for r in doc["records"]] == ["v17", "v18", "v19"]
    got, doc = await served.api(f"/api/messages?topic={name}&partition=1"
                                f"&timestamp={1_700_000_000_005}&limit=2")
    assert got == 200 and [r["offset"] for r in doc["records"]] == [5, 6]


async def test_a_broker_outage_is_shown_and_survived(tmp_path: Path) -> None:
    """The broker stops: the API keeps the last sample and says the cluster does not answer;
    the broker comes back on its port: the console follows without a restart."""
    b = EmbeddedBroker(tmp_path / "data", 0).start()
    port = b.port
    try:
        async with _serve(f"127.0.0.1:{port}") as s:
            got, before = await s.api("/api/cluster")
            assert got == 200 and before["error"] is None
            await asyncio.to_thread(b.stop)

            async def failing() -> Any:
                return (await s.api("/api/cluster"))[1]["error"]

            await _until("the outage to show", failing)
            got, during = await s.api("/api/cluster")
            assert got == 200 and during["cluster_id"] == before["cluster_id"]
            b = await asyncio.to_thread(EmbeddedBroker(tmp_path / "data", port).start)

            async def answering() -> Any:
                return (await s.api("/api/cluster"))[1]["error"] is None

            await _until("the console to see the broker again", answering, 60)
    finally:
        b.stop()


async def test_a_share_group_is_shown_with_its_share_partitions(
        served: Served, broker: InProcessBroker) -> None:
    """Share groups in the console (KIP-932, issue 25 item 6): listed with their state,
    members and lag; their page shows each share-partition's start offset, lag, the
    members sharing it, and its records in flight and archived."""
    from confluent_kafka import AcknowledgeType, ShareConsumer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    topic, group = f"q-{uuid.uuid4().hex[:6]}", f"sg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    for f in admin.incremental_alter_configs([ConfigResource(
            ResourceType.GROUP, group, incremental_configs=[ConfigEntry(
                "share.auto.offset.reset", "earliest",
                incremental_operation=AlterConfigOpType.SET)])]).values():
        f.result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p.produce(topic, str(i).encode(), partition=0)
        p.flush(10)  # one record per batch: acknowledged one by one below

    def consume() -> Any:
        c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                           "share.acknowledgement.mode": "explicit"})
        c.subscribe([topic])
        seen: list[Any] = []
        deadline = time.monotonic() + 30
        while len(seen) < 10 and time.monotonic() < deadline:
            seen += [m for m in c.poll(0.5) or [] if not m.error()]
        for m in seen:  # 0-4 accepted, 6 rejected (archived), 5 and 7-9 released
            v = int(m.value())
            c.acknowledge(m, AcknowledgeType.ACCEPT if v < 5 else
                          AcknowledgeType.REJECT if v == 6 else AcknowledgeType.RELEASE)
        c.commit_sync()
        return c

    c = await asyncio.to_thread(consume)
    try:
        async def page() -> Any:
            status, doc = await served.api(f"/api/groups/{group}")
            return doc if status == 200 and doc.get("partitions") else None
        doc = await _until("the share group's page", page)
        assert doc["type"] == "share" and doc["state"] == "STABLE"
        (m,) = doc["members"]
        assert m["assignment"] == [{"topic": topic, "partition": 0}]
        (row,) = doc["partitions"]
        assert (row["committed_offset"], row["high_watermark"]) == (5, 10)
        assert (row["archived"], row["lag"]) == (1, 4)  # 5, 7-9 to do; 6 done (archived)
        assert row["in_flight"] == 4 and row["member_id"] == m["member_id"]

        async def listed() -> Any:
            _, groups = await served.api("/api/groups")
            g = next((g for g in groups["groups"] if g["group"] == group), None)
            return g if g is not None and g["topics"] else None  # a sample after the join
        g = await _until("the share group in the list", listed)
        assert g["type"] == "share" and g["members"] == 1 and g["topics"] == [topic]
    finally:
        await asyncio.to_thread(c.close)
