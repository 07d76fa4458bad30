"""headrace: a Kafka-protocol commit log in Python."""

__version__ = "0.1.0"
