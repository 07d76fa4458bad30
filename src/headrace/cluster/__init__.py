"""The replicated cluster on ZooKeeper (docs/cluster.md)."""
