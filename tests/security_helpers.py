"""What the security tests (issue 12) share: confluent-kafka ACL bindings and admin results,
client settings for SASL users, and a broker's PLAIN, TLS and listener settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.brokerproc import BrokerProcess

ANON = "User:ANONYMOUS"
ACL_AUTHORIZER = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"}
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


# ---------------------------------------------------------------- admin client


def acl(rt: ResourceType, name: str, op: AclOperation, perm: AclPermissionType = ALLOW,
        pattern: ResourcePatternType = LIT, principal: str = ANON) -> AclBinding:
    """A confluent-kafka ACL binding, for every host."""
    return AclBinding(rt, name, pattern, principal, "*", op, perm)


def ok(fut: Any) -> Any:
    """An admin future's result (raises its KafkaException)."""
    return fut.result(timeout=15)


def code_of(fut: Any) -> int:
    """The error code an admin future fails with (it must fail)."""
    with pytest.raises(KafkaException) as e:
        ok(fut)
    return int(e.value.args[0].code())


def commit(conf: dict[str, Any], tp: TopicPartition) -> int:
    """Commit ``tp`` (its offset) in the group of ``conf``'s consumer: 0 when the group's
    committed offset then reads back as that offset, else the commit's error code."""
    c = Consumer({**conf, "enable.auto.commit": False})
    try:
        try:
            c.commit(offsets=[tp], asynchronous=False)
        except KafkaException as e:
            return int(e.args[0].code())
        assert c.committed([TopicPartition(tp.topic, tp.partition)],
                           timeout=10)[0].offset == tp.offset
        return 0
    finally:
        c.close()


def scram_user(user: str, password: str) -> UserScramCredentialUpsertion:
    """A SCRAM-SHA-512 credential (4096 iterations) to upsert."""
    return UserScramCredentialUpsertion(user, ScramCredentialInfo(
        ScramMechanism.SCRAM_SHA_512, 4096), password.encode())


def sasl_conf(bootstrap: str, user: str, password: str, *, mechanism: str = "PLAIN",
              protocol: str = "SASL_PLAINTEXT", **extra: Any) -> dict[str, Any]:
    """confluent-kafka settings of a SASL user."""
    return {"bootstrap.servers": bootstrap, "security.protocol": protocol,
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            **extra}


# ---------------------------------------------------------------- broker settings


def plain_jaas(users: dict[str, str], login: str = "admin") -> str:
    """A PLAIN listener's JAAS config: ``users`` may log in, the broker itself as ``login``."""
    return ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{login}" password="{users[login]}" '
            + " ".join(f'user_{u}="{p}"' for u, p in users.items()) + ";")


def pem_keystore(certs: dict[str, Path]) -> dict[str, str]:
    """The broker's TLS settings with ``write_dev_certs``' files."""
    return {"ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs["broker.pem"]),
            "ssl.truststore.location": str(certs["ca.pem"])}


_ENDPOINT = re.compile(r"127\.0\.0\.1:(\d+) \((\w+)")


def listener_ports(b: BrokerProcess) -> dict[str, int]:
    """Each listener's port, read from the broker's ``listening on`` line."""
    line = next(x for x in b.stderr_lines if "listening on" in x)
    return {name: int(port) for port, name in _ENDPOINT.findall(line)}
