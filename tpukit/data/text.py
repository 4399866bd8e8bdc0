"""Text as byte-level tokens: language-model windows from files, fixed-length token ids for classification.

The vocabulary is the 256 byte values of UTF-8 (id = byte; id 0 doubles as padding, since NUL does not occur
in text), so there is nothing to build or ship, and any language or code works. A model reading these tokens
needs `vocab_size: 256`.

Files must be UTF-8: one that is not (say Latin-1) raises `CorruptDataError` naming the file and the first bad byte,
or, with `skip_corrupt=True`, is left out whole (its bytes would be other characters' codes) and counted by `scan`.
"""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np
import tensorflow as tf

from tpukit.data import corrupt
from tpukit.data.pipeline import shard

logger = logging.getLogger("tpukit")

VOCAB_SIZE = 256
PAD_ID = 0


def default_corpus() -> str:
    """The Python standard library's own .py sources: a few MB of real text on every machine, no download."""
    return os.path.join(os.path.dirname(os.__file__), "*.py")


def encode_bytes(text: tf.Tensor, sequence_length: int) -> tf.Tensor:
    """UTF-8 bytes of a scalar string as int32 ids `[sequence_length]`: truncated, or padded with PAD_ID."""
    ids = tf.io.decode_raw(text, tf.uint8, fixed_length=sequence_length)
    return tf.ensure_shape(tf.cast(ids, tf.int32), (sequence_length,))


def to_tokens(texts: list[bytes]) -> np.ndarray:
    """Concatenated byte ids (uint8) of `texts`, each followed by a newline so documents stay apart."""
    return np.frombuffer(
        b"".join(t if t.endswith(b"\n") else t + b"\n" for t in texts), dtype=np.uint8
    )


def pack_windows(tokens: np.ndarray, sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping next-token windows: inputs tokens[t:t+L], labels tokens[t+1:t+L+1], both int32 [N, L].

    The tail that does not fill a window is dropped.
    """
    count = (len(tokens) - 1) // sequence_length
    if count < 1:
        raise ValueError(
            f"pack_windows: {len(tokens)} tokens do not fill one window of sequence_length={sequence_length}. "
            "Fix: use a shorter sequence_length or more text."
        )
    used = tokens[: count * sequence_length + 1].astype(np.int32)
    inputs = used[:-1].reshape(count, sequence_length)
    labels = used[1:].reshape(count, sequence_length)
    return inputs, labels


def split_windows(
    inputs: np.ndarray, labels: np.ndarray, split: str, test_fraction: float, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic split: the last `test_fraction` of the windows are 'test', the rest 'train'."""
    if split not in ("train", "test"):
        raise ValueError(f"{source}: unknown split {split!r}; valid splits: train, test.")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(
            f"{source}: test_fraction must be in (0, 1); received test_fraction={test_fraction}."
        )
    num_test = max(1, int(round(len(inputs) * test_fraction)))
    if num_test >= len(inputs):
        raise ValueError(
            f"{source}: only {len(inputs)} windows, too few for a train/test split. "
            "Fix: use more text or a shorter sequence_length."
        )
    cut = len(inputs) - num_test
    return (inputs[:cut], labels[:cut]) if split == "train" else (inputs[cut:], labels[cut:])


def not_utf8(path: str, content: bytes) -> corrupt.CorruptRecord | None:
    """Where `content` stops being UTF-8 (a `CorruptRecord`: the file is the record), or None if it is UTF-8."""
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as failure:
        line = content.count(b"\n", 0, failure.start) + 1
        return corrupt.CorruptRecord(
            path,
            0,
            failure.start,
            f"not UTF-8: byte 0x{content[failure.start]:02x} on line {line} ({failure.reason})",
        )
    return None


def _read_files(
    file_pattern: str, max_bytes: int | None, skip_corrupt: bool = False
) -> tuple[list[bytes], list[str], list[corrupt.CorruptRecord]]:
    """UTF-8 files in sorted order (until `max_bytes`), their paths, and the files left out as not UTF-8."""
    paths = sorted(tf.io.gfile.glob(file_pattern))
    if not paths:
        raise ValueError(
            f"text_files: no file matches file_pattern={file_pattern!r}. Fix: pass a glob of text files "
            "(local or gs://), e.g. 'data/*.txt', or leave it unset for the Python standard library's sources."
        )
    texts, kept, skipped, total = [], [], [], 0
    for path in paths:
        with tf.io.gfile.GFile(path, "rb") as f:
            content = f.read()
        fault = not_utf8(path, content)
        if fault and not skip_corrupt:
            raise corrupt.CorruptDataError(
                f"text_files: {fault.path} is not UTF-8: byte offset {fault.offset}: {fault.reason}. Fix: set "
                "data.skip_corrupt: true to leave such files out, or convert the file to UTF-8 (e.g. "
                "`iconv -f latin1 -t utf-8`).",
                [fault],
            )
        if fault:
            skipped.append(fault)
            continue
        texts.append(content)
        kept.append(path)
        total += len(content)
        if max_bytes is not None and total >= max_bytes:
            break
    if not texts:
        raise corrupt.CorruptDataError(
            f"text_files: none of the {len(paths)} file(s) matching {file_pattern!r} is UTF-8 "
            f"(first: {skipped[0].describe()}). Fix: convert them to UTF-8.",
            skipped,
        )
    if skipped:
        logger.info(
            "tpukit: text_files: left out %d file(s) that are not UTF-8 (data.skip_corrupt): %s",
            len(skipped),
            "; ".join(r.describe() for r in skipped[: corrupt.NAMED]),
        )
    return texts, kept, skipped


def text_files(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    file_pattern: str | None = None,
    sequence_length: int = 128,
    test_fraction: float = 0.1,
    max_bytes: int | None = None,
    skip_corrupt: bool = False,
) -> tf.data.Dataset:
    """Byte-level language-model windows `(tokens[L], next_tokens[L])` from the text files matching a glob.

    Files are read in sorted order (local or gs://), concatenated and packed into non-overlapping windows of
    `sequence_length`; the last `test_fraction` of the windows form the 'test' split, so the split is the same
    on every host and every run. The corpus is held in memory (it is meant for corpora of up to a few GB).

    Args:
        split: 'train' or 'test'.
        input_context: keeps this input pipeline's share of the windows.
        file_pattern: glob of text files; None: the Python standard library's .py files (offline default).
        sequence_length: tokens per window (the model's context length).
        test_fraction: fraction of windows held out for 'test'.
        max_bytes: read files (in order) only until this many bytes (quick experiments).
        skip_corrupt: leave out files that are not UTF-8 instead of failing (`scan` counts them). Set by the run
            from `data.skip_corrupt`.
    """
    pattern = file_pattern or default_corpus()
    if sequence_length < 1:
        raise ValueError(
            f"text_files: sequence_length must be >= 1; received sequence_length={sequence_length}."
        )
    texts, paths, _ = _read_files(pattern, max_bytes, skip_corrupt)
    tokens = to_tokens(texts)
    inputs, labels = split_windows(
        *pack_windows(tokens, sequence_length), split, test_fraction, "text_files"
    )
    digest = hashlib.sha1("\n".join(paths).encode()).hexdigest()[:8]
    logger.info(
        "tpukit: text_files %r: %d files (%s), %.1f MB, %d %s windows of %d bytes",
        pattern,
        len(paths),
        digest,
        len(tokens) / 1e6,
        len(inputs),
        split,
        sequence_length,
    )
    return shard(tf.data.Dataset.from_tensor_slices((inputs, labels)), input_context)


def scan(
    split: str = "train", file_pattern: str | None = None, max_bytes: int | None = None, **_
) -> corrupt.CorruptReport:
    """The files `text_files(skip_corrupt=True)` leaves out (not UTF-8); the unit is the file."""
    texts, _, skipped = _read_files(file_pattern or default_corpus(), max_bytes, skip_corrupt=True)
    return corrupt.CorruptReport(
        "text_files", split, "file", len(texts) + len(skipped), None, skipped
    )
