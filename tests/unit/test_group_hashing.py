"""Coordinator placement matches Kafka's (R-GRP-2)."""

from headrace.group.hashing import java_string_hashcode, offsets_partition_for


def test_java_string_hashcode_known_values() -> None:
    # values computed by Java's String.hashCode
    assert java_string_hashcode("") == 0
    assert java_string_hashcode("a") == 97
    assert java_string_hashcode("hello") == 99162322
    assert java_string_hashcode("polygenelubricants") == -2147483648
    assert java_string_hashcode("ü€") == 252 * 31 + 8364


def test_partition_for_uses_kafkas_abs() -> None:
    assert offsets_partition_for("polygenelubricants", 50) == 0  # MIN_VALUE & 0x7fffffff
    assert offsets_partition_for("hello", 50) == 99162322 % 50
    assert all(0 <= offsets_partition_for(f"g{i}", 50) < 50 for i in range(200))
