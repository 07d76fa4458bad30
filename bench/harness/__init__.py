"""The benchmark harness behind ``bench/run.py``: brokers, workloads, machine limits, report."""
