"""Corrupt inputs: find them, name them (file and record), or skip and count them.

Two policies, chosen by the recipe's `data.skip_corrupt`:

  * false (default): a corrupt record stops the run with a `CorruptDataError` naming the file, the record and the
    fix. Corruption found while the run is built (TFRecord framing when a split is counted, text that is not UTF-8)
    raises at once; corruption met later inside `fit` surfaces as a TensorFlow error, which
    `tpukit.data.explain_data_error` turns into the same `CorruptDataError` by scanning the split.
  * true: the pipeline drops what it cannot read or decode (`tf.data.Dataset.ignore_errors`, native, no Python in
    the input path), and a scan before training (`scan_tfrecords`) counts and names every record it will drop.

A TFRecord file is a sequence of `[length u64][crc of length u32][data][crc of data u32]`
(https://www.tensorflow.org/tutorials/load_data/tfrecord#tfrecords_format_details). TensorFlow's reader stops at
the first record whose framing or checksum is wrong and moves on to the next file, so everything after that point
of the file is lost: the scan reports it as one corrupt record plus the bytes not read.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import struct
from collections.abc import Callable, Sequence

import tensorflow as tf

logger = logging.getLogger("tpukit")

FIX = "Fix: set data.skip_corrupt: true to skip such records, or repair/regenerate the file."
# Bytes of framing around each TFRecord payload: length (8), its CRC (4), the payload's CRC (4).
FRAMING_BYTES = 16
READ_BUFFER_BYTES = 8 * 1024 * 1024
REDUCE_BATCH = 4096
# Corrupt records named in full in messages and metrics; the rest are counted.
NAMED = 5


class CorruptDataError(ValueError):
    """An input file holds a record that cannot be read or decoded; the message names the file, record and fix."""

    def __init__(self, message: str, records: Sequence[CorruptRecord] = ()):
        super().__init__(message)
        self.records = list(records)


@dataclasses.dataclass(frozen=True)
class CorruptRecord:
    """One unreadable record: `index` counts records from 0 in its file, `offset` is its first byte."""

    path: str
    index: int
    offset: int | None
    reason: str

    def describe(self) -> str:
        where = f"record {self.index}" + (
            f" (byte offset {self.offset})" if self.offset is not None else ""
        )
        return f"{self.path}: {where}: {self.reason}"


@dataclasses.dataclass
class CorruptReport:
    """What a scan found in one split.

    Attributes:
        source, split: what was scanned.
        unit: what a record is: 'record' (TFRecord) or 'file' (text files, dropped whole).
        scanned: records (or files) scanned.
        readable: records the pipeline reads and shards before decoding, i.e. the count to size evaluation with
            (`eval_batches`: records that fail to decode become zero-weight padding); None when the source counts
            its own examples (text windows).
        corrupt: every corrupt record found, in file order.
        unread_bytes: bytes after a framing error that no reader reaches.
    """

    source: str
    split: str
    unit: str
    scanned: int
    readable: int | None
    corrupt: list[CorruptRecord]
    unread_bytes: int = 0

    @property
    def skipped(self) -> int:
        return len(self.corrupt)

    @property
    def good(self) -> int:
        return self.scanned - self.skipped

    def examples(self, counted: int) -> int:
        """Examples the skipping pipeline yields from a split that `EXAMPLE_COUNTS`/the source counted as
        `counted`: the good records for TFRecord sources (their count includes the records that fail to decode);
        `counted` itself for text, whose windows are counted after the bad files are left out."""
        return self.good if self.unit == "record" else counted

    def summary(self) -> str:
        """One log line: the count, then the first corrupt records by name."""
        if not self.corrupt:
            return f"{self.source} split {self.split!r}: {self.scanned} {self.unit}s scanned, none corrupt"
        named = "; ".join(r.describe() for r in self.corrupt[:NAMED])
        more = f"; and {self.skipped - NAMED} more" if self.skipped > NAMED else ""
        unread = (
            f" ({self.unread_bytes} bytes after framing errors unread)" if self.unread_bytes else ""
        )
        return (
            f"{self.source} split {self.split!r}: skipping {self.skipped} corrupt {self.unit}(s) of {self.scanned} "
            f"scanned{unread}: {named}{more}"
        )

    def to_json(self) -> dict:
        """For `metrics.json`: the count and the first corrupt records by name."""
        return {
            "unit": self.unit,
            "scanned": int(self.scanned),
            "skipped": self.skipped,
            "unread_bytes": int(self.unread_bytes),
            "first": [r.describe() for r in self.corrupt[:NAMED]],
        }


def error(source: str, split: str, records: Sequence[CorruptRecord]) -> CorruptDataError:
    """The default policy's error: the first corrupt records by name, the count, the fix."""
    named = "; ".join(r.describe() for r in records[:NAMED])
    more = f" (and {len(records) - NAMED} more)" if len(records) > NAMED else ""
    return CorruptDataError(
        f"{source}: corrupt input in split {split!r}: {named}{more}. {FIX}",
        records,
    )


def _file_size(path: str) -> int:
    return tf.io.gfile.stat(path).length


def framing_fault(path: str, offset: int, size: int) -> str:
    """Why the TFRecord reader stops at `offset`: reads the 12-byte record header there (one small read)."""
    left = size - offset
    if left < 12:
        return f"truncated: {left} byte(s) left, fewer than a record header (12)"
    with tf.io.gfile.GFile(path, "rb") as f:
        f.seek(offset)
        header = f.read(12)
    (length,) = struct.unpack("<Q", header[:8])
    if length + FRAMING_BYTES > left:
        return f"truncated: the record says {length} bytes of data, the file has {left - FRAMING_BYTES} left"
    return "corrupt: checksum mismatch (not a TFRecord file, or damaged bytes)"


def _inspect(path: str, check, first: int, last: int | None) -> tuple[list[CorruptRecord], int]:
    """Every corrupt record of one file, eagerly (called only for files the fast pass found broken)."""
    size, offset, found = _file_size(path), 0, []
    iterator = iter(tf.data.TFRecordDataset(path))
    index = 0
    while True:
        try:
            record = next(iterator)
        except StopIteration:
            break
        except tf.errors.OpError:
            if last is not None and index >= last:  # past what the pipeline reads: harmless
                return found, 0
            found.append(CorruptRecord(path, index, offset, framing_fault(path, offset, size)))
            return found, size - offset
        if check is not None and index >= first and (last is None or index < last):
            try:
                check(record)
            except (tf.errors.OpError, ValueError) as failure:
                reason = getattr(failure, "message", str(failure)).split("\n")[0]
                # TensorFlow prefixes "{{function_node ...}} " and appends " [Op:DecodeImage] ...".
                reason = re.sub(r"^\{\{[^}]*\}\}\s*", "", reason).split(" [Op:")[0].strip()
                found.append(CorruptRecord(path, index, offset, f"does not decode: {reason}"))
        offset += int(tf.strings.length(record)) + FRAMING_BYTES
        index += 1
    return found, 0


def scan_tfrecords(
    files: Sequence[str],
    check: Callable[[tf.Tensor], tf.Tensor] | None = None,
    *,
    source: str = "tfrecords",
    split: str = "",
    ranges: Sequence[tuple[int, int | None]] | None = None,
    cycle_length: int = 16,
) -> CorruptReport:
    """Reads every record of `files` once (files in parallel) and finds the corrupt ones.

    Framing (truncation, checksums) is checked on every byte read; with `check`, every record is also passed to
    it (e.g. parse + decode the image) and a record it fails on is corrupt. The fast pass counts per file in
    tf.data; only files with a fault are then read again record by record to name the records.

    Args:
        files: TFRecord files.
        check: a tf function of one serialized record that raises on a bad one; None: framing only.
        source, split: for the report and messages.
        ranges: per file, `(first, end)` record indices the pipeline reads (TFDS slices); None: whole files.
            Records outside are read for framing but not checked, and faults after `end` are not reported.
        cycle_length: files read at once.
    """
    files = list(files)
    ranges = list(ranges) if ranges is not None else [(0, None)] * len(files)
    firsts = tf.constant([r[0] for r in ranges], tf.int64)
    ends = tf.constant([-1 if r[1] is None else r[1] for r in ranges], tf.int64)
    paths = tf.constant(files or [""])

    def sizes(batch):
        return tf.cast(tf.size(batch), tf.int64)

    def per_file(k):
        raw = tf.data.TFRecordDataset(paths[k], buffer_size=READ_BUFFER_BYTES).ignore_errors()
        # Reduced in batches: a reduce step per record costs several times the read itself (docs/performance.md).
        count, nbytes = raw.batch(REDUCE_BATCH).reduce(
            (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
            lambda acc, rs: (
                acc[0] + sizes(rs),
                acc[1]
                + tf.reduce_sum(tf.cast(tf.strings.length(rs), tf.int64))
                + FRAMING_BYTES * sizes(rs),
            ),
        )
        checked_ok = tf.constant(-1, tf.int64)  # framing only: nothing more to read
        if check is not None:  # a second read of the file (from the OS cache when local)
            end = tf.where(ends[k] < 0, tf.constant(tf.int64.max, tf.int64), ends[k])
            wanted = raw.skip(firsts[k]).take(end - firsts[k])
            wanted = wanted.map(check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
            ones = wanted.ignore_errors().map(lambda *_: tf.constant(1, tf.int64))
            checked_ok = ones.batch(REDUCE_BATCH).reduce(
                tf.constant(0, tf.int64), lambda n, b: n + sizes(b)
            )
        return tf.data.Dataset.from_tensors((k, count, nbytes, checked_ok))

    stats = tf.data.Dataset.range(len(files)).interleave(
        per_file,
        cycle_length=max(1, min(cycle_length, len(files))),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    corrupt, unread, scanned, readable = {}, 0, 0, 0
    for k, count, nbytes, checked_ok in stats.as_numpy_iterator():
        count, nbytes, checked_ok = int(count), int(nbytes), int(checked_ok)
        first, end = ranges[k]
        in_range = max(0, min(count, end if end is not None else count) - first)
        framing_ok = nbytes == _file_size(files[k])
        # A framing error inside the range drops one record the pipeline would have read.
        framing_loss = 0 if framing_ok or (end is not None and count >= end) else 1
        scanned += in_range + framing_loss
        readable += in_range
        if not framing_ok or checked_ok not in (-1, in_range):
            found, lost = _inspect(files[k], check, first, end)
            corrupt[k] = found
            unread += lost
    records = [r for k in sorted(corrupt) for r in corrupt[k]]
    return CorruptReport(source, split, "record", scanned, readable, records, unread)
