"""``headrace produce`` and ``headrace consume``: a console producer and consumer, like
Kafka's kafka-console-producer.sh / kafka-console-consumer.sh and kcat (issue 13).

Both talk to any Kafka-compatible broker through confluent-kafka (librdkafka), honour the
global ``headrace --command-config FILE`` client properties (``admin_cli.CLIENT_CONFIG``)
and take ``-X key=value`` librdkafka settings on top.

Speed: the producer reads its input in binary chunks and calls ``Producer.produce`` in a
tight loop with large batches (delivery reports only for failures); the consumer takes
records with ``Consumer.consume`` in batches and writes each batch to stdout in one call.
Both move well over a million small records a minute.

Exit codes: 0 success; 1 a delivery failed or the topic/partition does not exist;
2 bad input (options, templates); 3 no broker answered at the bootstrap address.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import string
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import click

from headrace.cli_support import check_reachable

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
REACH_TIMEOUT_S = 5.0  # how long to wait for a first answer from the bootstrap broker
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

_READ_CHUNK = 1 << 20
_CONSUME_BATCH = 2000
_POLL_S = 0.2  # how long one consume() waits: Ctrl-C is seen within this

_FIELDS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


class _Bad(Exception):
    """Bad input: one line on stderr, exit 2."""


def _count(n: int, noun: str) -> str:
    """``1 record``, ``2 records``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _die(msg: str, code: int) -> NoReturn:
    click.echo(f"headrace: {msg}", err=True)
    sys.exit(code)


def _pairs(values: tuple[str, ...], what: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        k, sep, val = v.partition("=")
        if not sep or not k:
            raise _Bad(f"{what} expects KEY=VALUE, got {v!r}")
        out.append((k, val))
    return out


def _unescape(s: str) -> str:
    r"""``\t``, ``\n``, ``\r``, ``\0`` and ``\\`` in separators and templates, as kcat."""
    out, i = [], 0
    table = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "\\": "\\"}
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in table:
            out.append(table[s[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _reason(e: Exception) -> str:
    """A librdkafka error's own text, without the KafkaError{...} wrapping."""
    err: Any = e.args[0] if e.args else None
    return str(err.str()) if hasattr(err, "str") else str(e)


def _client_config(bootstrap: str, verbose: bool, props: tuple[str, ...]) -> dict[str, Any]:
    from headrace.admin_cli import CLIENT_CONFIG

    conf: dict[str, Any] = dict(CLIENT_CONFIG)
    conf["bootstrap.servers"] = bootstrap  # -b wins over a command config's
    if not verbose:
        conf["log_level"] = 0  # librdkafka's connection logs only with --verbose
    conf.update(dict(_pairs(props, "-X/--property")))
    return conf


def _topic_metadata(client: Any, bootstrap: str, topic: str) -> Any:
    """The topic's metadata; exits 3 when no broker answers, 1 when the topic is missing."""
    from confluent_kafka import KafkaError, KafkaException

    unreachable = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                   KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
    deadline = time.monotonic() + REACH_TIMEOUT_S
    while True:
        try:
            md = client.list_topics(topic, timeout=max(0.5, deadline - time.monotonic()))
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if err is not None and err.code() in unreachable:
                _die(f"cannot reach a broker at {bootstrap}", EXIT_UNREACHABLE)
            _die(err.str() if err is not None else str(e), EXIT_FAILED)
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            return t
        code = t.error.code() if t is not None and t.error is not None else None
        if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            _die(f"topic '{topic}' does not exist", EXIT_FAILED)
        if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION):
            _die(f"topic {topic!r}: {t.error.str()}", EXIT_FAILED)
        if time.monotonic() > deadline:  # e.g. just auto-created, no leader yet
            return t
        time.sleep(0.1)


def _check_partitions(md: Any, topic: str, partitions: tuple[int, ...]) -> None:
    if md is None or not md.partitions:
        return
    for p in partitions:
        if p not in md.partitions:
            _die(f"topic '{topic}' has no partition {p} (it has {len(md.partitions)})",
                 EXIT_FAILED)


# ------------------------------------------------------------------ produce


def _lines(src: BinaryIO) -> Iterator[list[bytes]]:
    """Lists of complete lines (without their newline), read in binary chunks; a last line
    without a newline counts too."""
    read = getattr(src, "read1", src.read)
    rest = b""
    while True:
        chunk = read(_READ_CHUNK)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
        rest = lines.pop()
        if lines:
            yield lines
    if rest:
        yield [rest]


class _HeaderSyntax:
    """Per-line headers as kafka-console-producer's ``parse.headers``: a line starts with
    ``k1:v1,k2:v2`` and the headers delimiter (TAB), then the key and value as usual."""

    def __init__(self, delimiter: bytes, separator: bytes, key_separator: bytes) -> None:
        self.delimiter, self.separator, self.key_separator = delimiter, separator, key_separator

    def split(self, line: bytes) -> tuple[list[tuple[str, str | bytes | None]], bytes]:
        head, sep, rest = line.partition(self.delimiter)
        if not sep:
            return [], line
        out: list[tuple[str, str | bytes | None]] = []
        for item in head.split(self.separator) if head else ():
            k, _, v = item.partition(self.key_separator)
            out.append((k.decode("utf-8", "replace"), v))
        return out, rest


def _interruptible() -> None:
    """Ctrl-C (SIGINT) stops the command even when it was started with SIGINT ignored (a
    shell's background job, nohup): Python only turns SIGINT into KeyboardInterrupt when
    it is not ignored at start."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@click.command("produce")
@click.argument("topic")
@click.option("-b", "--bootstrap-server", "bootstrap", envvar="HEADRACE_BOOTSTRAP",
              default=DEFAULT_BOOTSTRAP, show_default=True,
              help="host:port of a broker (env HEADRACE_BOOTSTRAP).")
@click.option("-f", "--file", "file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Read lines from this file instead of stdin.")
@click.option("-K", "--key-separator", default=None, metavar="SEP",
              help=r"Each line is KEY SEP VALUE (split at the first SEP; \t allowed). "
                   "A line without SEP is a value with no key.")
@click.option("-H", "--header", "headers", multiple=True, metavar="K=V",
              help="A header on every record (repeatable).")
@click.option("--parse-headers", is_flag=True,
              help="Each line starts with its own headers, kafka-console-producer style: "
                   r"'k1:v1,k2:v2\tKEY SEP VALUE' (see --headers-delimiter, "
                   "--headers-separator, --headers-key-separator).")
@click.option("--headers-delimiter", default=r"\t", show_default=True,
              help="Ends the per-line headers.")
@click.option("--headers-separator", default=",", show_default=True,
              help="Between per-line headers.")
@click.option("--headers-key-separator", default=":", show_default=True,
              help="Between a per-line header's key and value.")
@click.option("-p", "--partition", type=int, default=None,
              help="Write every record to this partition (default: the partitioner's "
                   "choice, by key).")
@click.option("-z", "--compression", default="none", show_default=True,
              type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]))
@click.option("--acks", default="all", show_default=True, type=click.Choice(["0", "1", "all"]))
@click.option("--linger-ms", type=click.IntRange(0, 900_000), default=20, show_default=True,
              help="How long to wait to fill a batch.")
@click.option("-X", "--property", "props", multiple=True, metavar="KEY=VALUE",
              help="Any librdkafka producer setting (repeatable), e.g. -X batch.size=1000000.")
@click.option("-v", "--verbose", is_flag=True, help="Show librdkafka's logs.")
def produce_command(topic: str, bootstrap: str, file: Path | None, key_separator: str | None,
                    headers: tuple[str, ...], parse_headers: bool, headers_delimiter: str,
                    headers_separator: str, headers_key_separator: str,
                    partition: int | None, compression: str, acks: str, linger_ms: int,
                    props: tuple[str, ...], verbose: bool) -> None:
    """Write lines from stdin (or --file) to TOPIC, one record per line.

    Prints a summary (records, bytes, failures) on stderr at the end; exits 1 if any
    record could not be delivered."""
    _interruptible()
    try:
        fixed: list[tuple[str, str | bytes | None]] = [
            (k, v.encode()) for k, v in _pairs(headers, "--header")]
        sep = _unescape(key_separator).encode() if key_separator is not None else None
        if sep == b"":
            raise _Bad("--key-separator must not be empty")
        syntax = None
        if parse_headers:
            parts = [_unescape(s).encode() for s in
                     (headers_delimiter, headers_separator, headers_key_separator)]
            if not all(parts):
                raise _Bad("the --headers-* separators must not be empty")
            syntax = _HeaderSyntax(*parts)
        if partition is not None and partition < 0:
            raise _Bad(f"--partition must be >= 0, got {partition}")
        conf = _client_config(bootstrap, verbose, ())
        conf.update({
            "acks": acks, "compression.type": compression, "linger.ms": linger_ms,
            "batch.num.messages": 100_000, "batch.size": 4_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "message.timeout.ms": 60_000,
            "delivery.report.only.error": True,
        })
        conf.update(dict(_pairs(props, "-X/--property")))
        src: BinaryIO
        if file is not None:
            try:
                src = open(file, "rb")  # noqa: SIM115 - closed below
            except OSError as e:
                raise _Bad(f"cannot read {file}: {e.strerror}") from None
        else:
            src = sys.stdin.buffer
    except _Bad as e:
        _die(str(e), EXIT_USAGE)
    check_reachable(bootstrap)  # unreachable, not Kafka, TLS/SASL refused: one line at once
    try:
        _produce(topic, bootstrap, conf, src, sep, fixed, syntax, partition)
    except KeyboardInterrupt:  # before the first record (e.g. waiting for the broker)
        _die("interrupted", 130)
    finally:
        if file is not None:
            src.close()


def _produce(topic: str, bootstrap: str, conf: dict[str, Any], src: BinaryIO,
             sep: bytes | None, fixed: list[tuple[str, str | bytes | None]],
             syntax: _HeaderSyntax | None,
             partition: int | None) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    INVALID_RECORD = KafkaError.INVALID_RECORD
    failures = 0
    first_error: list[str] = []
    keyless_refused = False

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal failures, keyless_refused
        if err is not None:
            failures += 1
            if not first_error:
                first_error.append(err.str())
            if msg is not None and msg.key() is None and err.code() == INVALID_RECORD:
                keyless_refused = True  # Kafka's answer to a keyless record when compacted

    conf["on_delivery"] = on_delivery
    try:
        producer = Producer(conf)
    except (KafkaException, ValueError, TypeError) as e:
        _die(f"invalid producer configuration: {_reason(e)}", EXIT_USAGE)
    md = _topic_metadata(producer, bootstrap, topic)
    if partition is not None:
        _check_partitions(md, topic, (partition,))
    part = -1 if partition is None else partition
    records = nbytes = 0
    started = time.monotonic()
    produce, poll = producer.produce, producer.poll
    interrupted = False
    try:
        for lines in _lines(src):
            for line in lines:
                hdrs: list[tuple[str, str | bytes | None]] | None = fixed or None
                if syntax is not None:
                    own, line = syntax.split(line)
                    if own:
                        hdrs = fixed + own
                key = None
                if sep is not None:
                    k, s, v = line.partition(sep)
                    if s:
                        key, line = k, v
                while True:
                    try:
                        if hdrs is None:
                            produce(topic, line, key, part)
                        else:
                            produce(topic, line, key, part, headers=hdrs)
                        break
                    except BufferError:  # the local queue is full: let it drain
                        poll(0.05)
                records += 1
                nbytes += len(line) + (len(key) if key is not None else 0)
            poll(0)
    except KeyboardInterrupt:
        interrupted = True
    except KafkaException as e:
        _die(f"cannot produce: {e.args[0].str() if e.args else e}", EXIT_FAILED)
    try:
        remaining = producer.flush(0)
        while remaining:
            remaining = producer.flush(0.5)
    except KeyboardInterrupt:  # a second Ctrl-C: give up on what is still queued
        remaining = len(producer)
        failures += remaining
        if not first_error:
            first_error.append("interrupted before delivery")
    elapsed = time.monotonic() - started
    rate = records / elapsed if elapsed > 0 else 0.0
    summary = (f"headrace: produced {_count(records, 'record')} ({nbytes} bytes) to {topic} in "
               f"{elapsed:.1f} s ({rate:,.0f}/s): {records - failures} delivered, "
               f"{failures} failed")
    if first_error:
        summary += f" (first error: {first_error[0]})"
    if interrupted:
        summary += " [interrupted]"
    click.echo(summary, err=True)
    if keyless_refused:
        click.echo(f"headrace: hint: {topic} is a compacted topic (cleanup.policy=compact): "
                   "it takes only records with a key; give each line a key and name the "
                   "separator, e.g. 'user-1:hello' with -K :", err=True)
    sys.exit(EXIT_FAILED if failures else 0)


# ------------------------------------------------------------------ consume


def _parse_offset(spec: str | None, from_beginning: bool) -> tuple[str, int]:
    """--offset as (kind, value): beginning, end, absolute N, tail N (-N), or @timestamp."""
    if spec is None:  # --from-beginning: where to start without a committed offset
        return "default", 0
    if from_beginning:
        raise _Bad("use either --from-beginning or --offset, not both")
    s = spec.strip().lower()
    if s in ("beginning", "earliest"):
        return "beginning", 0
    if s in ("end", "latest"):
        return "end", 0
    try:
        if s.startswith("@"):
            ts = int(s[1:])
            if ts < 0:
                raise ValueError
            return "timestamp", ts
        n = int(s)
    except ValueError:
        raise _Bad(f"--offset expects beginning, end, N, -N or @TIMESTAMP_MS, got {spec!r}"
                   ) from None
    return ("absolute", n) if n >= 0 else ("tail", -n)


def _compile_format(template: str) -> str:
    tpl = _unescape(template)
    try:
        for _, field, _spec, _conv in string.Formatter().parse(tpl):
            if field is not None and field not in _FIELDS:
                raise _Bad(f"--template: unknown placeholder {{{field}}} (known: "
                           + ", ".join("{" + f + "}" for f in _FIELDS) + ")")
        tpl.format(**{f: "" for f in _FIELDS})
    except (ValueError, IndexError, KeyError) as e:
        raise _Bad(f"--template: {e}") from None
    return tpl if tpl.endswith("\n") else tpl + "\n"


def _text(b: bytes | None) -> str:
    return "" if b is None else b.decode("utf-8", "surrogateescape")


def _render_headers(hs: list[tuple[str, bytes | None]] | None) -> str:
    if not hs:
        return ""
    return ",".join(f"{k}:{_text(v)}" for k, v in hs)


def json_bytes(b: bytes | None, out: dict[str, Any], name: str) -> None:
    if b is None:
        out[name] = None
        return
    try:
        out[name] = b.decode("utf-8")
    except UnicodeDecodeError:
        out[name] = base64.b64encode(b).decode("ascii")
        out[name + "_encoding"] = "base64"


def _as_json(m: Any) -> bytes:
    ts_type, ts = m.timestamp()
    obj: dict[str, Any] = {"topic": m.topic(), "partition": m.partition(),
                           "offset": m.offset(), "timestamp": ts if ts_type else None}
    json_bytes(m.key(), obj, "key")
    json_bytes(m.value(), obj, "value")
    hs = []
    for k, v in m.headers() or ():
        h: dict[str, Any] = {"key": k}
        json_bytes(v, h, "value")
        hs.append(h)
    obj["headers"] = hs
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogateescape") + b"\n"


def _formatter(template: str | None, as_json: bool) -> Callable[[Any], bytes]:
    if as_json:
        return _as_json
    if template is None or _unescape(template) in ("{value}", "{value}\n"):
        def raw(m: Any) -> bytes:
            v = m.value()
            return (v or b"") + b"\n"
        return raw
    tpl = _compile_format(template)
    fmt = tpl.format
    need_headers = "{headers" in tpl

    def render(m: Any) -> bytes:
        ts_type, ts = m.timestamp()
        return fmt(key=_text(m.key()), value=_text(m.value()), topic=m.topic(),
                   partition=m.partition(), offset=m.offset(),
                   timestamp=ts if ts_type else "",
                   headers=_render_headers(m.headers()) if need_headers else "",
                   ).encode("utf-8", "surrogateescape")
    return render


@click.command("consume")
@click.argument("topic")
@click.option("-b", "--bootstrap-server", "bootstrap", envvar="HEADRACE_BOOTSTRAP",
              default=DEFAULT_BOOTSTRAP, show_default=True,
              help="host:port of a broker (env HEADRACE_BOOTSTRAP).")
@click.option("-g", "--group", default=None,
              help="Consume as a member of this group (partitions assigned by the group, "
                   "offsets committed). Without it: no group, every partition (or "
                   "--partition) is read, nothing committed.")
@click.option("--from-beginning", is_flag=True,
              help="Start at the earliest offset (with --group: when it has no committed "
                   "offset).")
@click.option("-o", "--offset", "offset", default=None, metavar="WHERE",
              help="beginning | end | N (absolute) | -N (the last N of each partition) | "
                   "@TIMESTAMP_MS (the first record at or after it). Default: end, or the "
                   "group's committed offsets.")
@click.option("-p", "--partition", "partitions", type=int, multiple=True,
              help="Read only this partition (repeatable).")
@click.option("-n", "--max-messages", type=click.IntRange(min=1), default=None,
              help="Exit after this many records.")
@click.option("--timeout-ms", type=click.IntRange(min=1), default=None,
              help="Exit when no record arrives for this long.")
@click.option("-e", "--exit-at-end", is_flag=True,
              help="Exit at the end of every partition read (as kcat -e).")
@click.option("--isolation-level", default="read_uncommitted", show_default=True,
              type=click.Choice(["read_committed", "read_uncommitted"]))
@click.option("-F", "--template", "template", default=None, metavar="TEMPLATE",
              help="How to print each record: a template with {key}, {value}, {topic}, "
                   "{partition}, {offset}, {timestamp}, {headers} (k1:v1,k2:v2) and \\t, "
                   "\\n escapes; default '{value}'.")
@click.option("--format", "fmt", default=None, metavar="[text|json]",
              help="text: each record as --template says (the default); json: as --json. "
                   "(A template given here, the old spelling, still works, with a note.)")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per record: topic, partition, offset, timestamp, key, "
                   "value, headers (bytes that are not UTF-8 in base64, with "
                   "\"<field>_encoding\": \"base64\").")
@click.option("-X", "--property", "props", multiple=True, metavar="KEY=VALUE",
              help="Any librdkafka consumer setting (repeatable).")
@click.option("-v", "--verbose", is_flag=True, help="Show librdkafka's logs.")
def consume_command(topic: str, bootstrap: str, group: str | None, from_beginning: bool,
                    offset: str | None, partitions: tuple[int, ...], max_messages: int | None,
                    timeout_ms: int | None, exit_at_end: bool, isolation_level: str,
                    template: str | None, fmt: str | None, as_json: bool,
                    props: tuple[str, ...], verbose: bool) -> None:
    """Print TOPIC's records on stdout, one per line (the value, or --template / --json).

    Runs until Ctrl-C, --max-messages, --timeout-ms or --exit-at-end."""
    _interruptible()
    try:
        template, as_json = _format_choice(fmt, template, as_json)
        if template is not None and as_json:
            raise _Bad("use either --template or --json, not both")
        kind, value = _parse_offset(offset, from_beginning)
        if any(p < 0 for p in partitions):
            raise _Bad("--partition must be >= 0")
        render = _formatter(template, as_json)
        conf = _client_config(bootstrap, verbose, ())
        conf.update({
            "group.id": group or f"headrace-console-{os.getpid()}",
            "enable.auto.commit": group is not None,
            "enable.auto.offset.store": False,  # stored once printed (see _consume)
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "isolation.level": isolation_level,
            "enable.partition.eof": exit_at_end,
            "fetch.wait.max.ms": 100,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s) whenever its
            # prefetch queue is full: 6.5 s instead of 0.8 s for a million records
            "fetch.queue.backoff.ms": 10,
        })
        conf.update(dict(_pairs(props, "-X/--property")))
    except _Bad as e:
        _die(str(e), EXIT_USAGE)
    check_reachable(bootstrap)  # unreachable, not Kafka, TLS/SASL refused: one line at once
    _consume(topic, bootstrap, conf, group, kind, value, partitions, max_messages,
             timeout_ms, exit_at_end, render)


def _format_choice(fmt: str | None, template: str | None, as_json: bool
                   ) -> tuple[str | None, bool]:
    """``--format`` means text or json for ``consume`` as for every listing (issue 26);
    a record template given there (the old spelling) is taken as ``--template`` with a
    one-line note, anything else is a usage error."""
    if fmt is None or fmt == "text":
        return template, as_json
    if fmt == "json":
        return template, True
    if "{" in fmt or "\\" in fmt:
        if template is not None:
            raise _Bad("give the template once, with --template")
        click.echo("headrace: note: a record template is now given with -F/--template "
                   "(--format is text or json)", err=True)
        return fmt, as_json
    raise _Bad(f"--format: expected text or json, got {fmt!r} (a record template is "
               "-F/--template)")


def _start_offsets(consumer: Any, topic: str, parts: list[int], kind: str,
                   value: int) -> list[Any]:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, TopicPartition

    if kind == "timestamp":
        asked = [TopicPartition(topic, p, value) for p in parts]
        try:
            found = consumer.offsets_for_times(asked, timeout=15)
        except Exception as e:
            _die(f"cannot look up offsets for time {value}: {e}", EXIT_FAILED)
        # no record at or after the time: -1, i.e. the end
        return [TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                for tp in found]
    if kind == "tail":
        out = []
        for p in parts:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
            out.append(TopicPartition(topic, p, max(lo, hi - value)))
        return out
    start = {"beginning": OFFSET_BEGINNING, "end": OFFSET_END, "absolute": value,
             "default": OFFSET_INVALID}[kind]
    return [TopicPartition(topic, p, start) for p in parts]


def _consume(topic: str, bootstrap: str, conf: dict[str, Any], group: str | None, kind: str,
             value: int, partitions: tuple[int, ...], max_messages: int | None,
             timeout_ms: int | None, exit_at_end: bool, fmt: Callable[[Any], bytes]) -> None:
    from confluent_kafka import Consumer, KafkaError, KafkaException

    try:
        consumer = Consumer(conf)
    except (KafkaException, ValueError, TypeError) as e:
        _die(f"invalid consumer configuration: {_reason(e)}", EXIT_USAGE)
    out = sys.stdout.buffer
    count = 0
    rc = 0
    quiet = False
    try:
        md = _topic_metadata(consumer, bootstrap, topic)
        _check_partitions(md, topic, partitions)
        at_end: set[int] = set()
        assigned: set[int] = set()
        # a group member given no partition (more members than partitions) is at the end
        # of all it has as soon as that assignment arrives
        given_nothing = [False]
        if group is not None and not partitions:
            overridden: set[int] = set()

            def on_assign(c: Any, tps: list[Any]) -> None:
                assigned.update(tp.partition for tp in tps)
                given_nothing[0] = not assigned
                # --offset overrides the committed offsets once per partition: after a
                # rebalance the group resumes from what this run committed
                fresh = [tp.partition for tp in tps if tp.partition not in overridden]
                if kind != "default" and fresh:
                    overridden.update(fresh)
                    c.assign([tp for tp in tps if tp.partition not in fresh]
                             + _start_offsets(c, topic, fresh, kind, value))

            def on_revoke(_c: Any, tps: list[Any]) -> None:
                assigned.difference_update(tp.partition for tp in tps)
                at_end.difference_update(tp.partition for tp in tps)

            consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        else:
            parts = list(partitions) or sorted(md.partitions)
            if kind == "default" and group is None:
                kind = "beginning" if conf.get("auto.offset.reset") == "earliest" else "end"
            consumer.assign(_start_offsets(consumer, topic, parts, kind, value))
            assigned.update(parts)
        idle_deadline = (time.monotonic() + timeout_ms / 1000) if timeout_ms else None
        eof = KafkaError._PARTITION_EOF
        while True:
            msgs: list[Any] = consumer.consume(_CONSUME_BATCH, _POLL_S)
            if msgs:
                chunks = []
                last: dict[int, Any] = {}
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == eof:
                            at_end.add(int(m.partition()))
                            continue
                        if err.fatal() or err.code() in (
                                KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                KafkaError.GROUP_AUTHORIZATION_FAILED,
                                KafkaError.UNKNOWN_TOPIC_OR_PART):
                            raise KafkaException(err)
                        click.echo(f"headrace: {err.str()}", err=True)
                        continue
                    p = int(m.partition())
                    at_end.discard(p)
                    chunks.append(fmt(m))
                    last[p] = m
                    count += 1
                    if max_messages is not None and count >= max_messages:
                        break
                if chunks:
                    out.write(b"".join(chunks))
                    out.flush()
                    if group is not None:
                        for m in last.values():
                            consumer.store_offsets(message=m)
                    if idle_deadline is not None:
                        idle_deadline = time.monotonic() + timeout_ms / 1000  # type: ignore[operator]
            if max_messages is not None and count >= max_messages:
                break
            if exit_at_end and (at_end >= assigned if assigned else given_nothing[0]):
                break
            if idle_deadline is not None and time.monotonic() >= idle_deadline:
                break
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # the reader went away (| head): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        quiet = True
    except KafkaException as e:
        err = e.args[0] if e.args else None
        click.echo(f"headrace: {err.str() if err is not None else e}", err=True)
        rc = EXIT_FAILED
    finally:
        with contextlib.suppress(KafkaException, RuntimeError, KeyboardInterrupt):
            consumer.close()  # commits the group's stored offsets
    if not quiet:
        click.echo(f"headrace: consumed {_count(count, 'record')}", err=True)
    sys.exit(rc)
