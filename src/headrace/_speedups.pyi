from typing_extensions import Buffer

CHECK_OFFSETS: int
CHECK_TIMES: int
REQUIRE_KEYS: int

def records_ok(data: Buffer, count: int, base_timestamp: int, lo: int, hi: int,
               flags: int) -> bool: ...

def record_fields(data: Buffer, count: int, end: int, ts_delta: Buffer, off_delta: Buffer,
                  key_pos: Buffer, key_len: Buffer, value_pos: Buffer, value_len: Buffer,
                  header_pos: Buffer) -> bool: ...

def binary_column(data: Buffer, pos: Buffer, length: Buffer
                  ) -> tuple[bytes, bytes, bytes | None, int] | None: ...
