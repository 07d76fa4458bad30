"""Config definitions: parsing, validation, broker defaults behind topic configs."""

import pytest

from headrace.config import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    load_properties,
    log_config,
    parse_overrides,
)


def test_topic_config_defaults_come_from_broker_config() -> None:
    broker = BrokerConfig.from_mapping({"log.retention.ms": "1000", "log.segment.bytes": "4096"})
    cfg = log_config(broker, {})
    assert cfg.retention_ms == 1000
    assert cfg.segment_bytes == 4096
    assert log_config(broker, {"retention.ms": 5}).retention_ms == 5


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("retention.ms", "soon", "expected an integer"),
        ("retention.ms", "-2", "at least -1"),
        ("segment.bytes", "99999999999", "32-bit"),
        ("cleanup.policy", "delete,shred", "'shred' is not one of"),
        ("cleanup.policy", "", "must not be empty"),
        ("unclean.leader.election.enable", "yes", "true or false"),
        ("no.such.config", "1", "unknown configuration"),
    ],
)
def test_bad_topic_configs_are_rejected_with_the_reason(
    name: str, value: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        parse_overrides({name: value}, TOPIC_CONFIGS)
    assert info.value.name == name


def test_every_topic_config_has_a_broker_default() -> None:
    for d in TOPIC_CONFIGS.values():
        assert d.broker_name in BROKER_CONFIGS, d.name
        assert BROKER_CONFIGS[d.broker_name].kind == d.kind


def test_properties_file(tmp_path) -> None:
    p = tmp_path / "server.properties"
    p.write_text("# comment\nnum.partitions = 4\nlog.dirs=/tmp/x\n\n")
    cfg = BrokerConfig.from_mapping(load_properties(p))
    assert cfg["num.partitions"] == 4
    assert str(cfg.data_dir) == "/tmp/x"
    p.write_text("garbage line\n")
    with pytest.raises(ConfigError, match="expected key=value"):
        load_properties(p)


def test_readme_documents_every_config() -> None:
    """The README's configuration tables list every broker and topic config."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in [*BROKER_CONFIGS, *TOPIC_CONFIGS]:
        assert f"| `{name}` |" in readme, name
