"""``headrace demo --cluster`` (issue 9, item 6): the pipeline on a local 3-broker cluster
(RF 3), one broker killed with -9 and restarted mid-run; the audit finds lost 0 and
duplicated 0, and the Spark source and sink followed the leader changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zk import ZK_SERVER

pytestmark = pytest.mark.timeout(400)


def test_demo_on_a_cluster_with_a_broker_killed(tmp_path: Path) -> None:
    if not ZK_SERVER.exists():
        pytest.fail("ZooKeeper is not installed (bash scripts/test.sh installs it)")
    out = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "demo", "--cluster", "--duration", "24",
         "--rate", "150", "--workdir", str(tmp_path / "demo"), "--json"],
        capture_output=True, text=True, timeout=380, env={**os.environ})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["produced"] > 0
    assert summary["lost"] == 0 and summary["duplicated"] == 0
    # issue 10 item 4: the result topics, read with read_committed, hold exactly their
    # warehouse tables' rows (written in the sink's transactional mode)
    assert summary["results_lost"] == 0 and summary["results_duplicated"] == 0, summary
    assert all(a["topic_records"] == a["table_rows"] > 0
               for a in summary["results_audit"].values()), summary["results_audit"]
    assert summary["consumed"] == summary["produced"] == summary["warehouse_rows"]
    assert summary["cluster"]["broker_killed"] in (1, 2, 3)
    assert summary["cluster"]["fault_error"] is None
    assert "fault: killed broker" in out.stderr and "restarted" in out.stderr
