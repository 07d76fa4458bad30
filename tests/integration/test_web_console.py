"""``headrace console`` (issue 13, "what users reach for first" 4) end to end: a real broker
process, the console as users start it (a subprocess printing its URL), real
confluent-kafka producers and consumers making the data, and Debian's Chromium driven by
Playwright reading the page.

What the page must show is compared with what the Kafka clients say, never with
hard-coded values: the cluster id, controller and brokers (AdminClient.describe_cluster),
partitions, leaders, ISR and high watermarks (describe_topics, get_watermark_offsets), a
group's member and lag (its committed offsets against the high watermarks), and the
records a consumer reads from a partition and offset (keys, values, headers; JSON values
pretty-printed). The charts must be drawn from real data: Plotly's trace paths exist, the
plotted numbers are the API's, and element screenshots contain the trace colour along a
line; the messages table's screenshot is not blank and grows with its rows.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess, wait_until
from tests.conftest import require_tool

HEADRACE = [sys.executable, "-m", "headrace.cli"]
INTERVAL_S = 0.5
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
_URL = re.compile(r"(http://\S+/)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HEADRACE_BOOTSTRAP", "HEADRACE_COMMAND_CONFIG", "HEADRACE_VERBOSE")}
    return {**env, "PYTHONUNBUFFERED": "1"}


class ConsoleProcess:
    """``headrace console --port 0`` in a child process; ready once it prints its URL."""

    def __init__(self, bootstrap: str, *extra: str, env: dict[str, str] | None = None
                 ) -> None:
        self.proc = subprocess.Popen(
            [*HEADRACE, "console", "-b", bootstrap, "--port", "0", "--interval",
             str(INTERVAL_S), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**_env(), **(env or {})})
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.url: str | None = None
        started = threading.Event()

        def pump_out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.stdout.append(line)
                m = _URL.search(line)
                if m and self.url is None:
                    self.url = m.group(1)
                    started.set()
            started.set()

        def pump_err() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr.append(line)

        threading.Thread(target=pump_out, daemon=True).start()
        threading.Thread(target=pump_err, daemon=True).start()
        if not started.wait(30) or self.url is None:
            self.proc.kill()
            raise RuntimeError("the console did not start:\n" + "".join(self.stderr))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def api(self, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
        assert self.url is not None
        req = urllib.request.Request(self.url + path.lstrip("/"), data=body,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


@dataclass
class Scene:
    """The data the console is to show, made with confluent-kafka."""

    bootstrap: str
    topic: str  # 3 partitions; known records in partition 1; a group with lag
    live_topic: str  # produced to all along: non-zero throughput
    group: str
    client_id: str
    committed: dict[int, int]
    produced: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)


def _records(n: int) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
    """Keys, values and headers of every kind the browser shows differently: JSON objects
    and arrays, plain text, bytes that are not UTF-8, a null key, several headers."""
    out: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = []
    for i in range(n):
        key = None if i == 4 else f"user-{i}".encode()
        if i % 5 == 1:
            value = f"plain text {i}".encode()
        elif i % 5 == 3:
            value = bytes([0xFF, 0xFE, i, 0x80])  # not UTF-8: base64 in the browser
        elif i % 5 == 2:
            value = json.dumps([i, "two", {"three": 3}]).encode()
        else:
            value = json.dumps({"id": i, "name": f"item {i}", "tags": ["a", "b"],
                                "nested": {"ok": True, "n": None}}).encode()
        headers = [("source", b"test"), ("seq", str(i).encode())]
        if i % 2:
            headers.append(("trace-id", uuid.uuid4().hex.encode()))
        out.append((key, value, headers))
    return out


def _produce_live(scene: Scene) -> None:
    p = Producer({"bootstrap.servers": scene.bootstrap, "linger.ms": 5, "log_level": 0})
    i = 0
    while not scene.stop.is_set():
        for _ in range(20):
            p.produce(scene.live_topic, value=f"tick {i}".encode())
            i += 1
        p.poll(0)
        scene.stop.wait(0.05)
    p.flush(10)
    scene.produced = i


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("broker")
    with BrokerProcess(data, {"num.partitions": "1",
                              "group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


@pytest.fixture(scope="module")
def scene(broker: BrokerProcess) -> Iterator[Scene]:
    suffix = uuid.uuid4().hex[:6]
    s = Scene(broker.bootstrap, f"orders-{suffix}", f"clicks-{suffix}", f"billing-{suffix}",
              f"billing-worker-{suffix}", committed={})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futs = admin.create_topics([NewTopic(s.topic, 3, 1), NewTopic(s.live_topic, 2, 1)])
    for f in futs.values():
        f.result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 0})
    for key, value, headers in _records(20):
        p.produce(s.topic, key=key, value=value, headers=headers, partition=1)
    for i in range(7):
        p.produce(s.topic, key=f"k{i}".encode(), value=b"x", partition=0)
    p.produce(s.topic, value=b"y", partition=2)
    assert p.flush(15) == 0
    # a group with one live member that has committed part of each partition: lag
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": s.group,
                  "client.id": s.client_id, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 30000})
    c.subscribe([s.topic])
    wait_until(lambda: (c.poll(0.1), len(c.assignment()) == 3)[1], 30,
               what="the group's assignment")
    s.committed = {0: 2, 1: 5, 2: 0}
    c.commit(offsets=[TopicPartition(s.topic, p, o) for p, o in s.committed.items()],
             asynchronous=False)
    live = threading.Thread(target=_produce_live, args=(s,), daemon=True)
    live.start()
    s.threads.append(live)
    try:
        yield s
    finally:
        s.stop.set()
        live.join(15)
        c.close()


@pytest.fixture(scope="module")
def console(broker: BrokerProcess, scene: Scene) -> Iterator[ConsoleProcess]:
    proc = ConsoleProcess(broker.bootstrap)
    try:
        yield proc
    finally:
        if proc.proc.poll() is None:
            rc = proc.stop(signal.SIGTERM)
            assert rc == 0, "".join(proc.stderr)
        err = "".join(proc.stderr)
        assert "Traceback" not in err, err


@pytest.fixture(scope="module")
def page(console: ConsoleProcess) -> Iterator[Any]:
    chromium = require_tool("chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.set_default_timeout(20_000)
        try:
            yield pg
        finally:
            browser.close()
    # the only errors allowed: the 4xx answers the tests provoke (shown in the page)
    unexpected = [e for e in errors if not e.startswith(
        "Failed to load resource: the server responded with a status of 4")]
    assert not unexpected, errors


def _go(page: Any, console: ConsoleProcess, hash_: str) -> None:
    page.goto(f"{console.url}#{hash_}")


def _cell(page: Any, row: str, col: str) -> str:
    text: str = page.locator(f"{row} td[data-col='{col}']").inner_text()
    return text.strip()


# ------------------------------------------------------------------ pages


def test_overview_shows_the_cluster_as_the_admin_client_sees_it(
        page: Any, console: ConsoleProcess, scene: Scene) -> None:
    admin = AdminClient({"bootstrap.servers": scene.bootstrap})
    cluster = admin.describe_cluster(request_timeout=10).result(15)
    _go(page, console, "overview")
    page.wait_for_selector("#brokers-table tbody tr[data-testid='broker-row']")
    assert page.inner_text("#cluster-id") == cluster.cluster_id
    assert page.inner_text("#controller-id") == str(cluster.controller.id)
    assert page.inner_text("#under-replicated-count") == "0"
    assert page.inner_text("#offline-count") == "0"
    rows = page.locator("#brokers-table tbody tr")
    assert rows.count() == len(cluster.nodes)
    for n in cluster.nodes:
        row = f"#brokers-table tr[data-broker-id='{n.id}']"
        assert _cell(page, row, "host") == n.host
        assert _cell(page, row, "port") == str(n.port)
        assert _cell(page, row, "role") == ("controller" if n.id == cluster.controller.id
                                            else "broker")


def test_topics_table_and_partition_view_match_the_clients(
        page: Any, console: ConsoleProcess, scene: Scene) -> None:
    _go(page, console, "topics")
    row = f"#topics-table tr[data-topic='{scene.topic}']"
    page.wait_for_selector(row)
    assert _cell(page, row, "partitions") == "3"
    assert _cell(page, row, "records") == str(20 + 7 + 1)
    live = f"#topics-table tr[data-topic='{scene.live_topic}']"
    page.wait_for_function(  # records/s of the topic produced to: the last sampled rate
        "sel => Number(document.querySelector(sel + \" td[data-col='records_per_s']\")"
        ".textContent) > 0", arg=live)
    page.click(f"{row} a")
    page.wait_for_selector("#partitions-table tbody tr[data-partition='2']")
    assert page.inner_text("#topic-detail-name") == scene.topic

    admin = AdminClient({"bootstrap.servers": scene.bootstrap})
    desc = admin.describe_topics(TopicCollection([scene.topic]))[scene.topic].result(15)
    c = Consumer({"bootstrap.servers": scene.bootstrap, "group.id": "test-watermarks"})
    try:
        for p in desc.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(scene.topic, p.id), timeout=10)
            prow = f"#partitions-table tr[data-partition='{p.id}']"
            assert _cell(page, prow, "leader") == str(p.leader.id)
            assert _cell(page, prow, "replicas") == ",".join(str(n.id) for n in p.replicas)
            assert _cell(page, prow, "isr") == ",".join(str(n.id) for n in p.isr)
            assert _cell(page, prow, "log_start_offset") == str(low)
            assert _cell(page, prow, "high_watermark") == str(high)
            assert _cell(page, prow, "size") not in ("-", "0 B")  # DescribeLogDirs sizes
    finally:
        c.close()


def _lags(scene: Scene) -> dict[int, int]:
    """High watermark minus committed offset per partition, as the clients say."""
    c = Consumer({"bootstrap.servers": scene.bootstrap, "group.id": scene.group,
                  "enable.auto.commit": False})
    try:
        committed = c.committed([TopicPartition(scene.topic, p) for p in range(3)],
                                timeout=10)
        out = {}
        for tp in committed:
            _, high = c.get_watermark_offsets(TopicPartition(scene.topic, tp.partition),
                                              timeout=10)
            out[tp.partition] = high - tp.offset
    finally:
        c.close()
    assert out == {p: {0: 7, 1: 20, 2: 1}[p] - o for p, o in scene.committed.items()}
    return out


def test_group_page_shows_the_member_lag_and_a_lag_chart(
        page: Any, console: ConsoleProcess, scene: Scene, tmp_path: Path) -> None:
    lags = _lags(scene)
    total = sum(lags.values())
    _go(page, console, "groups")
    row = f"#groups-table tr[data-group='{scene.group}']"
    page.wait_for_selector(row)
    assert _cell(page, row, "members") == "1"
    page.click(f"{row} a")
    page.wait_for_selector("#group-partitions-table tbody tr[data-partition='1']")
    assert page.inner_text("#group-total-lag") == str(total)
    assert page.inner_text("#group-state") == "STABLE"
    assert page.locator("#members-table tbody tr").count() == 1
    assert _cell(page, "#members-table tbody tr", "client_id") == scene.client_id
    assigned = _cell(page, "#members-table tbody tr", "assignment").split(", ")
    assert sorted(assigned) == [f"{scene.topic}-{p}" for p in range(3)]
    for p, lag in lags.items():
        prow = f"#group-partitions-table tr[data-partition='{p}']"
        assert _cell(page, prow, "committed_offset") == str(scene.committed[p])
        assert _cell(page, prow, "lag") == str(lag)

    # the lag chart: samples of the real lag, drawn as a line
    data = _wait_for_trace(page, "lag-chart", scene.group, lambda ys: len(ys) >= 3
                           and ys[-1] == total)
    status, api = console.api(f"/api/series/lag/{scene.group}")
    assert status == 200
    # the last point is the total the page asked for just now (the group page's own, issue
    # 26), at the page's time: the one the table shows; the others are the sampled series
    last_x, last_y = data["x"][-1], data["y"][-1]
    assert last_y == total and last_x >= data["x"][-2], (last_x, last_y)
    _assert_points_from_api({"x": data["x"][:-1], "y": data["y"][:-1]}, api["series"])
    assert total in data["y"]
    shot = tmp_path / "lag-chart.png"
    page.locator("#lag-chart").screenshot(path=str(shot))
    _assert_line_in_colour(shot, data["colour"])


def _wait_for_trace(page: Any, chart: str, name: str, ready: Any) -> dict[str, Any]:
    """The trace ``name`` of a Plotly chart (its x as epoch ms, y, colour) once ``ready(y)``,
    and its drawn path: ``d`` non-empty, spanning much of the plot's width (Plotly merges
    collinear points, so a steady value is one segment)."""
    script = """([id, name]) => {
        const gd = document.getElementById(id);
        if (!gd || !gd.data) return null;
        const i = gd.data.findIndex((t) => t.name === name);
        if (i < 0) return null;
        const tr = gd.data[i];
        const paths = gd.querySelectorAll('.scatterlayer .trace path.js-line');
        return {x: tr.x.map((d) => new Date(d).getTime()), y: Array.from(tr.y),
                colour: tr.line.color, d: paths[i] ? paths[i].getAttribute('d') : null};
    }"""
    deadline = time.monotonic() + 30
    while True:
        data = page.evaluate(script, [chart, name])
        if data and ready(data["y"]) and data["d"]:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{chart}: no trace {name!r} with the data wanted: {data}")
        page.wait_for_timeout(200)
    assert data["d"].count("L") >= 1, data["d"]
    xs = [float(x) for x in re.findall(r"[ML]([-\d.]+),", data["d"])]
    width = page.evaluate("id => document.getElementById(id).clientWidth", chart)
    assert max(xs) - min(xs) > width * 0.4, (data["d"], width)  # a line, not a dot
    return dict(data)


def _assert_points_from_api(data: dict[str, Any], series: dict[str, list[float]]) -> None:
    """Every plotted point is a sampled point of the API's series (same time, same value)."""
    api_points = dict(zip(series["t"], series["v"], strict=True))
    for x, y in zip(data["x"], data["y"], strict=True):
        assert x in api_points, (x, sorted(api_points)[:5])
        assert api_points[x] == pytest.approx(y), (x, y, api_points[x])


def _assert_line_in_colour(png: Path, colour: str, tolerance: int = 40) -> None:
    """The screenshot holds many pixels of the trace's colour, spread across the plot: a
    line was drawn, not a dot or a legend swatch alone."""
    from PIL import Image

    want = tuple(int(colour.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))
    img = Image.open(png).convert("RGB")
    width, height = img.size
    xs = [x for y in range(height) for x in range(width)
          if all(abs(a - b) <= tolerance for a, b in zip(img.getpixel((x, y)), want,
                                                         strict=True))]
    assert len(xs) >= 150, f"{png.name}: {len(xs)} pixels of {colour}"
    assert max(xs) - min(xs) >= width * 0.4, (png.name, min(xs), max(xs), width)


def test_throughput_chart_draws_the_records_coming_in(
        page: Any, console: ConsoleProcess, scene: Scene, tmp_path: Path) -> None:
    _go(page, console, "overview")
    data = _wait_for_trace(page, "throughput-chart", scene.live_topic,
                           lambda ys: sum(1 for y in ys if y > 0) >= 3)
    status, api = console.api("/api/series/throughput")
    assert status == 200 and api["unit"] == "records/s"
    _assert_points_from_api(data, api["topics"][scene.live_topic])
    rates = [y for y in data["y"] if y > 0]
    assert 50 < max(rates) < 100_000, rates  # ~400 records/s are produced
    shot = tmp_path / "throughput-chart.png"
    page.locator("#throughput-chart").screenshot(path=str(shot))
    _assert_line_in_colour(shot, data["colour"])


# ------------------------------------------------------------------ the message browser


def _expected_records(scene: Scene, partition: int, offset: int, n: int) -> list[Any]:
    c = Consumer({"bootstrap.servers": scene.bootstrap, "group.id": "test-expected",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(scene.topic, partition, offset)])
        out: list[Any] = []
        deadline = time.monotonic() + 15
        while len(out) < n and time.monotonic() < deadline:
            out += [m for m in c.consume(n - len(out), timeout=1) if m.error() is None]
    finally:
        c.close()
    assert len(out) == n
    return out


def _shown(payload: bytes | None, pretty: bool) -> tuple[str, str]:
    """(the CSS class, the text) a key or value is to be shown with."""
    if payload is None:
        return "null", "null"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "binary", base64.b64encode(payload).decode()
    if pretty:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict | list):
            return "json", json.dumps(parsed, indent=2, ensure_ascii=False)
    return "text", text


def _read_in_browser(page: Any, console: ConsoleProcess, topic: str, partition: int,
                     offset: int, limit: int) -> None:
    _go(page, console, "messages")
    page.wait_for_selector(f"#msg-topic option[value='{topic}']", state="attached")
    page.select_option("#msg-topic", topic)
    page.fill("#msg-partition", str(partition))
    page.select_option("#msg-mode", "offset")
    page.fill("#msg-offset", str(offset))
    page.fill("#msg-limit", str(limit))
    page.click("#msg-fetch")
    page.wait_for_function(
        "n => document.querySelectorAll('#messages-table tbody tr').length === n "
        "&& document.getElementById('msg-status').textContent.includes('record(s)')", arg=limit)


def test_message_browser_shows_what_a_consumer_reads(
        page: Any, console: ConsoleProcess, scene: Scene, tmp_path: Path) -> None:
    offset, n = 3, 12
    expected = _expected_records(scene, 1, offset, n)
    _read_in_browser(page, console, scene.topic, 1, offset, n)
    rows = page.locator("#messages-table tbody tr")
    assert rows.count() == n
    kinds = set()
    for i, m in enumerate(expected):
        row = rows.nth(i)
        assert row.get_attribute("data-offset") == str(m.offset())
        assert row.locator("td[data-col='offset']").inner_text() == str(m.offset())
        for col, payload, pretty in (("key", m.key(), False), ("value", m.value(), True)):
            cls, text = _shown(payload, pretty)
            kinds.add((col, cls))
            shown = row.locator(f"td[data-col='{col}'] pre.{cls}, "
                                f"td[data-col='{col}'] span.{cls}")
            assert shown.count() == 1, (i, col, cls, row.inner_html())
            assert shown.first.text_content() == text, (i, col)
        headers = row.locator("td[data-col='headers'] .header").all_text_contents()
        assert headers == [f"{k}: {v.decode()}" for k, v in m.headers()]
        ts = row.locator("td[data-col='timestamp']").get_attribute("title")
        assert ts is not None and ts.startswith(str(m.timestamp()[1]))
    # every way of showing a payload was exercised
    assert {("value", "json"), ("value", "text"), ("value", "binary"), ("key", "null"),
            ("key", "text")} <= kinds
    big = tmp_path / "messages-12.png"
    page.locator("#messages-table").screenshot(path=str(big))

    _read_in_browser(page, console, scene.topic, 1, offset, 2)
    small = tmp_path / "messages-2.png"
    page.locator("#messages-table").screenshot(path=str(small))
    _assert_table_not_blank(small)
    _assert_table_not_blank(big)
    from PIL import Image

    h_small, h_big = Image.open(small).size[1], Image.open(big).size[1]
    assert h_big > h_small * 3, (h_small, h_big)


def _assert_table_not_blank(png: Path) -> None:
    from PIL import Image

    img = Image.open(png).convert("L")
    width, height = img.size
    dark = sum(img.histogram()[:160])  # text and rules, not the white background
    assert dark > width * height * 0.005 and dark > 500, (png.name, dark, width, height)


def test_message_browser_by_timestamp_and_its_errors(
        page: Any, console: ConsoleProcess, scene: Scene) -> None:
    expected = _expected_records(scene, 1, 10, 1)[0]
    ts = expected.timestamp()[1]
    status, doc = console.api(f"/api/messages?topic={scene.topic}&partition=1"
                              f"&timestamp={ts}&limit=500")
    assert status == 200
    assert doc["records"][0]["timestamp"] == ts
    assert doc["records"][0]["offset"] <= expected.offset()  # the first at or after ts
    status, doc = console.api(f"/api/messages?topic={scene.topic}&partition=1&limit=3")
    assert status == 200 and [r["offset"] for r in doc["records"]] == [17, 18, 19]  # newest

    # by time in the page (a datetime-local field, whole seconds, the browser's time zone),
    # on the topic produced to all along: the first record at or after that second
    second_ms = (int(time.time()) - 2) * 1000
    c = Consumer({"bootstrap.servers": scene.bootstrap, "group.id": "test-times"})
    try:
        (found,) = c.offsets_for_times([TopicPartition(scene.live_topic, 0, second_ms)],
                                       timeout=10)
    finally:
        c.close()
    assert found.offset > 0
    _go(page, console, "messages")
    page.wait_for_selector(f"#msg-topic option[value='{scene.live_topic}']", state="attached")
    page.select_option("#msg-topic", scene.live_topic)
    page.fill("#msg-partition", "0")
    page.select_option("#msg-mode", "timestamp")
    page.fill("#msg-timestamp", datetime.fromtimestamp(second_ms / 1000).strftime(
        "%Y-%m-%dT%H:%M:%S"))
    page.fill("#msg-limit", "5")
    page.click("#msg-fetch")
    page.wait_for_function("() => document.querySelectorAll('#messages-table tbody tr')"
                           ".length === 5")
    first = page.locator("#messages-table tbody tr").first
    assert first.get_attribute("data-offset") == str(found.offset)
    shown_ts = first.locator("td[data-col='timestamp']").get_attribute("title")
    assert shown_ts is not None and int(shown_ts.split()[0]) >= second_ms
    # errors are shown in the page, not swallowed
    _go(page, console, f"messages?topic={scene.topic}&partition=9&offset=0")
    page.wait_for_function("() => document.getElementById('msg-status').className === 'error'")
    assert "has no partition 9" in page.inner_text("#msg-status")


# ------------------------------------------------------------------ topic creation


def test_create_topic_through_the_form(page: Any, console: ConsoleProcess,
                                       scene: Scene) -> None:
    name = f"created-{uuid.uuid4().hex[:6]}"
    _go(page, console, "topics")
    page.fill("#new-topic-name", name)
    page.fill("#new-topic-partitions", "4")
    page.fill("#new-topic-configs", "retention.ms=3600000")
    page.click("#create-topic-submit")
    page.wait_for_selector("#create-topic-result.ok")
    assert page.inner_text("#create-topic-result") == f"Created topic {name}."
    admin = AdminClient({"bootstrap.servers": scene.bootstrap})
    md = admin.list_topics(name, timeout=10)
    assert len(md.topics[name].partitions) == 4
    page.wait_for_selector(f"#topics-table tr[data-topic='{name}']")  # the sampler woke
    assert _cell(page, f"#topics-table tr[data-topic='{name}']", "partitions") == "4"

    page.fill("#new-topic-name", "no spaces allowed!")
    page.click("#create-topic-submit")
    page.wait_for_selector("#create-topic-result.error")
    assert "may contain only ASCII letters, digits" in page.inner_text("#create-topic-result")
    page.fill("#new-topic-name", name)  # exists already: the broker's words
    page.click("#create-topic-submit")
    page.wait_for_function(
        "n => document.getElementById('create-topic-result').className === 'error' && "
        "document.getElementById('create-topic-result').textContent.includes(n)", arg=name)
    assert "already exists" in page.inner_text("#create-topic-result").lower()


def test_a_broker_outage_is_shown_and_survived(page: Any, tmp_path: Path) -> None:
    """The broker dies: the console keeps serving the last sample and says the cluster does
    not answer (API and page banner, one log line); the broker comes back: so does the
    console, without a restart."""
    with BrokerProcess(tmp_path / "data", {"num.partitions": "1"}) as b:
        console = ConsoleProcess(b.bootstrap)
        try:
            status, before = console.api("/api/cluster")
            assert status == 200 and before["error"] is None
            page.goto(f"{console.url}#overview")
            page.wait_for_selector("#brokers-table tbody tr")
            assert page.locator("#banner").is_hidden()
            b.kill()
            wait_until(lambda: console.api("/api/cluster")[1]["error"], 30,
                       interval_s=0.1, what="the console to notice the outage")
            status, during = console.api("/api/cluster")
            assert status == 200 and during["cluster_id"] == before["cluster_id"]
            # the banner may first say the counts are stale (the sample in flight when the
            # broker died waits for its answer), then, at the page's next refresh, the error
            page.wait_for_function(
                "() => document.getElementById('banner').innerText.includes('does not answer')",
                timeout=30_000)
            assert page.locator("#banner").is_visible()
            b.start()
            wait_until(lambda: console.api("/api/cluster")[1]["error"] is None, 60,
                       interval_s=0.1, what="the console to see the broker again")
            page.wait_for_selector("#banner", state="hidden")
        finally:
            page.goto("about:blank")  # no more polling of the console about to stop
            assert console.stop() == 0
        err = "".join(console.stderr)
        assert "Traceback" not in err, err
        logged = [line for line in console.stderr if "logger=headrace.console" in line]
        assert len(logged) == 2, logged  # "sampling failed: ...", "answers again"


SASL_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
             'username="admin" password="admin-secret" user_admin="admin-secret";')


def test_command_config_tls_and_sasl(tmp_path: Path) -> None:
    """``headrace --command-config`` reaches a SASL_SSL listener: the sampled tables, the
    sizes (headrace's wire client: DescribeLogDirs) and the message browser (a consumer)
    all authenticate; a wrong password is one line and exit 4."""
    done = subprocess.run([*HEADRACE, "dev-certs", str(tmp_path / "certs")],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == 0, done.stderr
    ca = tmp_path / "certs" / "ca.pem"
    with BrokerProcess(tmp_path / "data", {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name": "PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tmp_path / "certs" / "broker.pem"),
        "ssl.truststore.location": str(ca),
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": SASL_JAAS,
        "num.partitions": "1",
    }) as b:
        line = next(x for x in b.stderr_lines if "listening on" in x)
        port = re.search(r"127\.0\.0\.1:(\d+) \(SASL_SSL", line)
        assert port is not None, line
        sasl = f"127.0.0.1:{port.group(1)}"
        p = Producer({"bootstrap.servers": b.bootstrap, "log_level": 0})
        p.produce("secured", key=b"k", value=b'{"a": 1}', headers=[("h", b"v")])
        assert p.flush(15) == 0
        props = tmp_path / "admin.properties"
        props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                         f"sasl.jaas.config={SASL_JAAS.split(' user_')[0]};\n"
                         f"ssl.truststore.location={ca}\n")
        console = ConsoleProcess(sasl, env={"HEADRACE_COMMAND_CONFIG": str(props)})
        try:
            status, topics = console.api("/api/topics")
            assert status == 200 and topics["error"] is None, topics
            (t,) = [t for t in topics["topics"] if t["name"] == "secured"]
            assert t["records"] == 1 and t["size_bytes"] and t["size_bytes"] > 0
            status, doc = console.api("/api/messages?topic=secured&partition=0&offset=0")
            assert status == 200, doc
            assert [(r["key"], r["value"], r["headers"]) for r in doc["records"]] == [
                ("k", '{"a": 1}', [{"key": "h", "value": "v"}])]
        finally:
            assert console.stop() == 0
        wrong = tmp_path / "wrong.properties"
        wrong.write_text(props.read_text().replace("admin-secret", "nope"))
        r = subprocess.run([*HEADRACE, "--command-config", str(wrong), "console", "-b", sasl,
                            "--port", "0"], capture_output=True, text=True, timeout=60,
                           env=_env())
        assert r.returncode == 4, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert "authentication" in r.stderr and "password" in r.stderr, r.stderr


# ------------------------------------------------------------------ hostile input, CLI


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
def test_bad_requests_are_json_errors(console: ConsoleProcess, path: str, status: int,
                                      words: str) -> None:
    got, doc = console.api(path)
    assert got == status, (got, doc)
    assert isinstance(doc, dict) and words in doc["error"], doc


def test_bad_posts_are_refused(console: ConsoleProcess) -> None:
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
        got, doc = console.api("/api/topics", body=body, headers=headers)
        assert got == status, (body[:40], got, doc)
        assert words in doc["error"], doc
    got, doc = console.api("/api/cluster", headers={"Host": "rebind.example:80"})
    assert got == 400 and "Host" in doc["error"]


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_unreachable_bad_input_and_signals(broker: BrokerProcess) -> None:
    port = _dead_port()
    started = time.monotonic()
    r = subprocess.run([*HEADRACE, "console", "-b", f"127.0.0.1:{port}", "--port", "0"],
                       capture_output=True, text=True, timeout=30, env=_env())
    assert r.returncode == 3, r.stderr
    assert r.stderr == f"headrace: cannot reach a broker at 127.0.0.1:{port}\n"
    assert time.monotonic() - started < 5
    r = subprocess.run([*HEADRACE, "console", "--port", "0"], capture_output=True, text=True,
                       timeout=30, env={**_env(), "HEADRACE_BOOTSTRAP": f"127.0.0.1:{port}"})
    assert r.returncode == 3, r.stderr
    assert r.stderr == f"headrace: cannot reach a broker at 127.0.0.1:{port}\n"
    for bad in (["--port", "70000"], ["--interval", "0"], ["--port", "x"],
                ["-b", "no-port"]):
        r = subprocess.run([*HEADRACE, "console", *bad], capture_output=True, text=True,
                           timeout=30, env=_env())
        assert r.returncode == 2, (bad, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("headrace: "), r.stderr
    # Ctrl-C: exit 130, one line, no traceback; the port taken: one line, exit 1
    first = ConsoleProcess(broker.bootstrap)
    assert first.url is not None
    taken = first.url.rsplit(":", 1)[1].strip("/")
    r = subprocess.run([*HEADRACE, "console", "-b", broker.bootstrap, "--port", taken],
                       capture_output=True, text=True, timeout=30, env=_env())
    assert r.returncode == 1 and "cannot listen on" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert first.stop(signal.SIGINT) == 130
    assert "".join(first.stderr).strip() == "headrace: interrupted"
    assert len(first.stdout) == 1 and first.stdout[0].startswith("headrace console: http://")
