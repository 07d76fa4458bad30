"""PURE: share sessions (KIP-932), the leader's memory of what a share consumer fetches.

Kafka's ``ShareSessionCache``, ``ShareSession`` and ``SharePartitionManager.newContext`` /
``acknowledgeSessionUpdate`` as a plain object. A share consumer keeps one session per
(group, member) on each broker it fetches from; ShareFetch names only what changed.

## Rules (``new_context`` for ShareFetch, ``acknowledge_update`` for ShareAcknowledge)

1. **Epoch 0 opens** a session (a *full* request): acknowledgements in it are
   INVALID_REQUEST; an existing session of the member is replaced; when the cache holds
   ``max_sessions`` (``group.share.max.share.sessions``, 2000) it is
   SHARE_SESSION_LIMIT_REACHED. The fetch covers the request's partitions.
2. **Epoch -1 closes** it (FinalContext): the session must exist (else
   SHARE_SESSION_NOT_FOUND); nothing is fetched, the acknowledgements are applied, then the
   session is released and the member's acquired records with it.
3. **Any other epoch** is a subsequent request: the session must exist
   (SHARE_SESSION_NOT_FOUND) and expect exactly that epoch (INVALID_SHARE_SESSION_EPOCH);
   the request's partitions are added, its forgotten ones removed, the epoch moves on
   (wrapping to 1), and the fetch covers every partition of the session.
4. **ShareAcknowledge** never opens a session: epoch 0 is INVALID_SHARE_SESSION_EPOCH; the
   session must exist; -1 leaves it to be released after the acknowledgements; any other
   epoch must be the expected one and moves it on.
5. **Responses** to a subsequent request carry only the partitions with records, an error,
   or not yet sent since they joined the session or since an error cleared
   (``CachedSharePartition.maybeUpdateResponseData``).
6. **A closed connection** releases the session opened on it (Kafka 4.1's
   ``ConnectionDisconnectListener``), as an epoch -1 request would.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = 2**31 - 1
DEFAULT_MAX_SESSIONS = 2000  # group.share.max.share.sessions

SharePartitionId = tuple[uuid.UUID, int]  # (topic id, partition)
SessionKey = tuple[str, str]  # (group id, member id)


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= MAX_EPOCH else epoch + 1


class ShareSessionError(Exception):
    """A request the session rules refuse as a whole (the response's top-level error)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ShareSession:
    key: SessionKey
    epoch: int
    connection_id: str
    # partition -> whether it must be in the next response (new, or an error cleared);
    # dicts keep insertion order, the order Kafka rotates over
    partitions: dict[SharePartitionId, bool] = field(default_factory=dict)

    def must_respond(self, partition: SharePartitionId, has_records: bool,
                     error: bool) -> bool:
        """Rule 5, updating what the session remembers."""
        pending = self.partitions.get(partition)
        if pending is None:
            return True
        respond = has_records or pending or error
        self.partitions[partition] = error  # after an error, the next answer goes out
        if has_records:  # Kafka moves it to the back (the next fetch starts elsewhere)
            del self.partitions[partition]
            self.partitions[partition] = False
        return respond


@dataclass(frozen=True, slots=True)
class FetchContext:
    """What one ShareFetch acts on."""

    session: ShareSession
    partitions: tuple[SharePartitionId, ...]  # to fetch (none for a final request)
    subsequent: bool
    final: bool


def parse_member_id(member_id: str | None) -> str:
    """Kafka parses the member id as a ``Uuid`` (base64url of 16 bytes, 22 characters);
    anything else is INVALID_REQUEST."""
    text = member_id or ""
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError):
        raw = b""
    if len(text) != 22 or len(raw) != 16:
        raise ShareSessionError(ErrorCode.invalid_request, f"Invalid member id: {text!r}")
    return text


class ShareSessionCache:
    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[SessionKey, ShareSession] = {}
        self._by_connection: dict[str, SessionKey] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def sessions_of_group(self, group_id: str) -> list[ShareSession]:
        return [s for k, s in self._sessions.items() if k[0] == group_id]

    def new_context(self, group_id: str, member_id: str, epoch: int,
                    fetch: list[SharePartitionId], forget: list[SharePartitionId],
                    acknowledging: bool, connection_id: str) -> FetchContext:
        """Rules 1-3; raises ``ShareSessionError``."""
        key = (group_id, member_id)
        if epoch == FINAL_EPOCH:
            session = self._sessions.get(key)
            if session is None:
                raise ShareSessionError(ErrorCode.share_session_not_found,
                                        f"Share session for {member_id} not found")
            return FetchContext(session, (), False, True)
        if epoch == INITIAL_EPOCH:
            if acknowledging:
                raise ShareSessionError(ErrorCode.invalid_request,
                                        "Acknowledge data present in the initial request")
            self.remove(group_id, member_id)
            if len(self._sessions) >= self.max_sessions:
                raise ShareSessionError(ErrorCode.share_session_limit_reached,
                                        "The share session cache is full")
            session = ShareSession(key, next_epoch(INITIAL_EPOCH), connection_id,
                                   dict.fromkeys(fetch, False))  # sent in full
            self._sessions[key] = session
            self._by_connection[connection_id] = key  # Kafka: the newest session on it
            return FetchContext(session, tuple(session.partitions), False, False)
        session = self._sessions.get(key)
        if session is None:
            raise ShareSessionError(ErrorCode.share_session_not_found,
                                    f"Share session for {member_id} not found")
        if session.epoch != epoch:
            raise ShareSessionError(ErrorCode.invalid_share_session_epoch,
                                    f"Expected share session epoch {session.epoch}, "
                                    f"got {epoch}")
        for p in fetch:
            session.partitions.setdefault(p, True)
        for p in forget:
            session.partitions.pop(p, None)
        session.epoch = next_epoch(session.epoch)
        return FetchContext(session, tuple(session.partitions), True, False)

    def acknowledge_update(self, group_id: str, member_id: str, epoch: int) -> ShareSession:
        """Rule 4; raises ``ShareSessionError``."""
        if epoch == INITIAL_EPOCH:
            raise ShareSessionError(ErrorCode.invalid_share_session_epoch,
                                    "ShareAcknowledge cannot open a share session")
        session = self._sessions.get((group_id, member_id))
        if session is None:
            raise ShareSessionError(ErrorCode.share_session_not_found,
                                    f"Share session for {member_id} not found")
        if epoch == FINAL_EPOCH:
            return session
        if session.epoch != epoch:
            raise ShareSessionError(ErrorCode.invalid_share_session_epoch,
                                    f"Expected share session epoch {session.epoch}, "
                                    f"got {epoch}")
        session.epoch = next_epoch(session.epoch)
        return session

    def remove(self, group_id: str, member_id: str) -> ShareSession | None:
        session = self._sessions.pop((group_id, member_id), None)
        if session is not None and self._by_connection.get(session.connection_id) == session.key:
            del self._by_connection[session.connection_id]
        return session

    def connection_closed(self, connection_id: str) -> ShareSession | None:
        """Rule 6: the session opened on the connection, removed (None if none)."""
        key = self._by_connection.pop(connection_id, None)
        if key is None:
            return None
        return self._sessions.pop(key, None)
