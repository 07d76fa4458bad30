from typing_extensions import Buffer

CHECK_OFFSETS: int
CHECK_TIMES: int
REQUIRE_KEYS: int

def records_ok(data: Buffer, count: int, base_timestamp: int, lo: int, hi: int,
               flags: int) -> bool: ...
