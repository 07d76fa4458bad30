"""A deterministic simulation of whole headrace clusters (issue 21).

One process, one ``random.Random(seed)``: N brokers whose replication decisions are the real
pure cores (``replication.leader``, ``replication.epochs``, ``replication.controller``)
against a simulated ZooKeeper, network, disks and clock (``world``), faults injected from a
schedule (``faults``), invariants checked after every step (``checkers``), a failing seed
shrunk and replayed (``run``); the ``headrace simulate`` command (``command``).
"""
