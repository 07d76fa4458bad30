"""The metrics module without a broker: the exposition of a snapshot, the latency
histogram's buckets, and /health and /ready answers (issue 13)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from wsgiref.util import setup_testing_defaults

from prometheus_client import CollectorRegistry, generate_latest

from headrace.broker.metrics import (
    LATENCY_BUCKETS_MS,
    PartitionGauges,
    Snapshot,
    _app,
    _BrokerCollector,
    _Latency,
)


def _snapshot(ready: bool = True, why: str = "") -> Snapshot:
    lat = _Latency()
    for ms in (0.5, 3.0, 3.0, 40_000.0):
        lat.observe(ms)
    return Snapshot(
        bytes_in={"t": 300}, messages_in={"t": 7}, bytes_out={"t": 120}, messages_out={"t": 5},
        requests={("Produce", 9): 4}, latency={"Produce": (lat.buckets, lat.sum_ms,
                                                           lat.count)},
        isr_shrinks=2, isr_expands=1,
        partitions=[PartitionGauges("t", 0, True, 3, 2, 2, 300, 0, 7),
                    PartitionGauges("t", 1, False, 3, 3, 2, 0, 0, 0),
                    PartitionGauges("u", 0, True, 3, 1, 2, -1, -1, -1)],
        offline_partitions=0, active_controller=1,
        group_offsets={("g", "t", 0): (5, 2)}, connections={"PLAINTEXT": 3},
        purgatory={"Produce": 1, "Fetch": 0}, ready=ready, not_ready_why=why)


def _fake(snapshot: Any) -> Any:
    def take() -> Snapshot:
        if isinstance(snapshot, BaseException):
            raise snapshot
        return snapshot  # type: ignore[no-any-return]

    fake = SimpleNamespace(registry=CollectorRegistry(auto_describe=False),
                           snapshot_from_thread=take)
    fake.registry.register(_BrokerCollector(fake))  # type: ignore[arg-type]
    return fake


def _call(app: Any, path: str) -> tuple[str, str]:
    environ: dict[str, Any] = {"PATH_INFO": path}
    setup_testing_defaults(environ)
    got: list[str] = []
    body = b"".join(app(environ, lambda status, headers: got.append(status)))
    return got[0], body.decode()


def test_latency_buckets_hold_each_observation_once() -> None:
    lat = _Latency()
    lat.observe(LATENCY_BUCKETS_MS[0])  # on a bound: that bucket (le is inclusive)
    lat.observe(LATENCY_BUCKETS_MS[-1] * 2)  # past the last bound: +Inf
    assert lat.buckets[0] == 1 and lat.buckets[-1] == 1 and sum(lat.buckets) == lat.count == 2


def test_exposition_uses_the_jmx_exporter_names() -> None:
    text = generate_latest(_fake(_snapshot()).registry).decode()
    for line in (
        'kafka_server_brokertopicmetrics_bytesin_total{topic="t"} 300.0',
        'kafka_server_brokertopicmetrics_messagesin_total{topic="t"} 7.0',
        'kafka_server_brokertopicmetrics_bytesout_total{topic="t"} 120.0',
        'kafka_server_brokertopicmetrics_messagesout_total{topic="t"} 5.0',
        'kafka_network_requestmetrics_requests_total{request="Produce",version="9"} 4.0',
        'kafka_network_requestmetrics_totaltimems_bucket{le="1.0",request="Produce"} 1.0',
        'kafka_network_requestmetrics_totaltimems_bucket{le="5.0",request="Produce"} 3.0',
        'kafka_network_requestmetrics_totaltimems_bucket{le="30000.0",request="Produce"} 3.0',
        'kafka_network_requestmetrics_totaltimems_bucket{le="+Inf",request="Produce"} 4.0',
        'kafka_network_requestmetrics_totaltimems_count{request="Produce"} 4.0',
        "kafka_server_replicamanager_underreplicatedpartitions 2.0",
        "kafka_server_replicamanager_underminisrpartitioncount 1.0",
        "kafka_server_replicamanager_leadercount 2.0",
        "kafka_server_replicamanager_isrshrinks_total 2.0",
        "kafka_server_replicamanager_isrexpands_total 1.0",
        "kafka_controller_kafkacontroller_activecontrollercount 1.0",
        'kafka_log_log_size{partition="0",topic="t"} 300.0',
        'kafka_consumergroup_lag{consumergroup="g",partition="0",topic="t"} 2.0',
        'kafka_consumergroup_current_offset{consumergroup="g",partition="0",topic="t"} 5.0',
        'kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation="Produce"} 1.0',
        'kafka_server_socketservermetrics_connection_count{listener="PLAINTEXT"} 3.0',
    ):
        assert line in text, line
    assert 'topic="u"' not in text.split("kafka_log_log_size", 1)[1]  # offline: no size
    assert "_created" not in text


def test_health_ready_and_not_ready() -> None:
    assert _call(_app(_fake(_snapshot())), "/health") == ("200 OK", "ok\n")
    assert _call(_app(_fake(_snapshot())), "/ready") == ("200 OK", "ready\n")
    assert _call(_app(_fake(_snapshot(False, "no controller known"))), "/ready") == (
        "503 Service Unavailable", "not ready: no controller known\n")
    stuck = _app(_fake(TimeoutError("the event loop did not answer within 5 s")))
    assert _call(stuck, "/ready")[0].startswith("503")
    assert _call(stuck, "/health")[0] == "200 OK"  # the process is up
    status, body = _call(stuck, "/metrics")
    assert status.startswith("503") and "did not answer" in body
    assert _call(stuck, "/favicon.ico")[0].startswith("404")
