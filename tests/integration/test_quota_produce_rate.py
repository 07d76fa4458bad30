"""The issue's quota test (issue 12, "What it must show"): a confluent-kafka producer whose
client.id is limited to 1 MB/s (producer_byte_rate=1048576) sends as fast as it can; its
rate over 20 s (after a 5 s warm-up that takes the bucket's initial credit, from
acknowledged bytes) is within 10% of 1 MB/s and never bursts: no two consecutive seconds
above 1.5 times the quota, no single second above the quota plus one produce request (a
request's records are acknowledged together; under load librdkafka fills each request to
its 1,000,000-byte ``message.max.bytes`` while muted, so a second's bucket holds 0, 1 or 2
whole requests depending on where its edges fall: 1.89 MiB was seen in one loaded run with
0.999 of the quota overall), while another client's small acks=1 produces, measured in the
same run, keep a p99 under 100 ms.

Byte rates are metered by a token bucket (``headrace.security.quotas.TokenBucket``), not
Kafka's sampled rate, which gave 0.74-0.79 of the quota here (bursts of ~10 MB when the
oldest sample expired, then seconds of silence).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess
from tests.quota_load import measure

pytestmark = pytest.mark.timeout(180)

QUOTA = 1_048_576
MAX_REQUEST = 1_000_000  # librdkafka's message.max.bytes: the largest produce request


def test_a_producer_limited_to_1_mb_s_stays_within_10_percent_and_others_are_unaffected(
        tmp_path: Path) -> None:
    warmup_s, window_s = 5.0, 20.0
    with BrokerProcess(tmp_path / "data") as broker:
        result = measure(broker.bootstrap, quota=QUOTA, warmup_s=warmup_s, window_s=window_s)
    print(result)
    assert not result["errors"], result
    # the other client, in the same run
    assert result["other_produces"] >= 100, result
    assert result["other_p99_ms"] < 100, result
    # steady: within 10% over the 20 s, and no burst in any second of it
    assert 0.9 <= result["ratio"] <= 1.1, result
    per_second = [mb * 1_048_576 for mb in result["per_second_mb"]]
    assert max(per_second) <= QUOTA + MAX_REQUEST, result
    assert max(a + b for a, b in itertools.pairwise(per_second)) <= 2 * 1.5 * QUOTA, result
