"""Is the input pipeline fast enough? Examples/s of each recipe's pipeline alone vs. what its train step consumes.

Run by hand (not a test):

    python benchmarks/input_pipeline.py              # every case whose model exists in tpukit.models.MODELS
    python benchmarks/input_pipeline.py --seconds 3  # longer timing windows
    python benchmarks/input_pipeline.py --quick      # every case, small: that it runs (tests/test_benchmarks_run.py)

Each case builds its pipeline exactly as `tpukit.run` does (recipe -> `input_fns`, default knobs) and times
batches drawn from it; the model's train step is timed separately on one fixed batch held in memory, compiled as
the run compiles it on this host. The ratio pipeline/step should be >= 3 so that input never limits training
(on this host both share the CPU cores, so the ratio is an upper bound of the headroom). Data is local and
offline: synthetic JPEG TFRecords written to a temp directory, the standard library's .py files, sklearn digits.
TFDS needs a download, which this benchmark does not do.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpukit.models import MODELS  # noqa: E402
from tpukit.planner import hardware as performance  # noqa: E402
from tpukit.recipe import from_dict  # noqa: E402
from tpukit.task import build_model, input_fns  # noqa: E402


def write_jpeg_tfrecords(
    directory: str, split: str, files: int, per_file: int, shape: tuple[int, int]
) -> str:
    """Synthetic ImageNet-layout TFRecords: smooth random images (JPEG-compressible, like photos)."""
    rng = np.random.default_rng(0)
    for k in range(files):
        with tf.io.TFRecordWriter(
            os.path.join(directory, f"{split}-{k:05d}-of-{files:05d}")
        ) as writer:
            for i in range(per_file):
                small = rng.integers(0, 256, (shape[0] // 8, shape[1] // 8, 3), dtype=np.uint8)
                image = tf.cast(tf.image.resize(small, shape), tf.uint8)
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image/encoded": tf.train.Feature(
                                bytes_list=tf.train.BytesList(
                                    value=[tf.io.encode_jpeg(image).numpy()]
                                )
                            ),
                            "image/class/label": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=[1 + i % 10])
                            ),
                        }
                    )
                )
                writer.write(example.SerializeToString())
    return os.path.join(directory, "{split}-*")


def cases(root: str, quick: bool = False) -> list[tuple[str, dict]]:
    """(name, recipe) pairs: real recipes' data sections with default pipeline knobs. Only training is timed, so
    no recipe has an eval split (tpukit reads an eval split's labels when it builds the model). `quick`: fewer
    files, small batches and models, 32 px for the ResNet-50 case: every path runs, in seconds."""
    cifar_pattern, imagenet_pattern = _written(root, quick)
    train = {"epochs": 1, "learning_rate": 0.01}
    cifar_data = {
        "source": "tfrecord_images",
        "file_pattern": cifar_pattern,
        "image_size": [32, 32],
        "augment": "crop_flip",
        "normalize": "unit",
        "label_offset": -1,
        "eval_split": None,
    }
    lm_data = {"source": "text_files", "sequence_length": 128, "eval_split": None}
    small = 16 if quick else None  # the quick size's global batch, for every case
    depth = 8 if quick else 20
    return [
        (
            "digits -> small_cnn",
            {
                "model": {"name": "small_cnn", "input_shape": [8, 8, 1]},
                "data": {
                    "source": "digits",
                    "global_batch_size": small or 64,
                    "shuffle_buffer": 2048,
                    "eval_split": None,
                },
                "train": train,
            },
        ),
        (
            f"tfrecord 32px jpeg -> resnet_cifar({depth})",
            {
                "model": {"name": "resnet_cifar", "depth": depth},
                "data": {**cifar_data, "global_batch_size": small or 128},
                "train": train,
            },
        ),
        (
            "tfrecord 32px jpeg -> vit",
            {
                "model": {"name": "vit", **({"num_layers": 1} if quick else {})},
                "data": {**cifar_data, "global_batch_size": small or 128},
                "train": train,
            },
        ),
        _resnet50_case(imagenet_pattern, quick, train),
        (
            "text_files stdlib -> causal_lm",
            {
                "model": {"name": "causal_lm", "vocab_size": 256, "sequence_length": 128},
                "data": {**lm_data, "global_batch_size": small or 32},
                "train": train,
            },
        ),
    ]


def _written(root: str, quick: bool) -> tuple[str, str]:
    """The cases' JPEG TFRecords under `root`, written: (the 32 px cifar-like pattern, the 500x375 imagenet-like)."""
    cifar = os.path.join(root, "cifar")
    imagenet = os.path.join(root, "imagenet")
    os.makedirs(cifar, exist_ok=True)
    os.makedirs(imagenet, exist_ok=True)
    files, per_file = (2, 64) if quick else (8, 512)
    cifar_pattern = write_jpeg_tfrecords(cifar, "train", files, per_file, (32, 32))
    imagenet_pattern = write_jpeg_tfrecords(
        imagenet, "train", files, 8 if quick else 48, (375, 500)
    )
    return cifar_pattern, imagenet_pattern


def _resnet50_case(pattern: str, quick: bool, train: dict) -> tuple[str, dict]:
    """ResNet-50 on the 500x375 JPEGs of `pattern`, decoded and resized to 224 px (32 px when `quick`)."""
    size = [32, 32] if quick else [224, 224]
    return (
        f"tfrecord 500x375 jpeg -> resnet50 @{size[0]}",
        {
            "model": {"name": "resnet50", "num_classes": 10, "input_shape": [*size, 3]},
            "data": {
                "source": "tfrecord_images",
                "file_pattern": pattern,
                "image_size": size,
                "label_offset": -1,
                "global_batch_size": 16 if quick else 32,
                "eval_split": None,
            },
            "train": train,
        },
    )


def pipeline_rate(dataset: tf.data.Dataset, batch: int, seconds: float) -> tuple[float, object]:
    iterator = iter(dataset)
    first = next(iterator)
    warm_until = (
        time.perf_counter() + seconds / 2
    )  # fills caches and shuffle buffers, lets autotune settle
    while time.perf_counter() < warm_until:
        next(iterator)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(iterator)
        count += 1
    return count * batch / (time.perf_counter() - start), first


def step_rate(recipe, batch_tensors, batch: int, seconds: float) -> float:
    strategy = tf.distribute.get_strategy()
    jit = performance.choose_jit_compile("auto", "default", 1).value
    with strategy.scope():
        model = build_model(recipe, total_steps=1000, jit_compile=jit, steps_per_execution=1)
    data = tf.data.Dataset.from_tensors(batch_tensors).repeat()
    model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # compile
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=1, epochs=1, verbose=0)
    one = max(time.perf_counter() - start, 1e-4)
    steps = max(2, int(seconds / one))
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    return steps * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing window per measurement")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every case, small and with short windows: that it runs",
    )
    args = parser.parse_args()
    seconds = min(args.seconds, 0.2) if args.quick else args.seconds
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name, raw in cases(root, args.quick):
            if raw["model"]["name"] not in MODELS:
                rows.append(
                    (name, None, None, f"model {raw['model']['name']!r} not in MODELS: skipped")
                )
                continue
            recipe = from_dict(raw, path=name)
            batch = recipe.data.global_batch_size
            train_fn, _ = input_fns(recipe, eval_examples=0)
            pipe, first = pipeline_rate(train_fn(None), batch, seconds)
            step = step_rate(recipe, first, batch, seconds)
            rows.append((name, pipe, step, ""))
            print(f"{name}: pipeline {pipe:,.0f}/s, train step {step:,.0f}/s", flush=True)
    print()
    print(
        f"host: {os.cpu_count()} CPU cores, TensorFlow {tf.__version__}, default strategy (one device)"
    )
    print(f"| {'case':45} | {'pipeline ex/s':>13} | {'train step ex/s':>15} | {'ratio':>6} |")
    print(f"|{'-' * 47}|{'-' * 15}|{'-' * 17}|{'-' * 8}|")
    for name, pipe, step, note in rows:
        if pipe is None:
            print(f"| {name:45} | {'-':>13} | {'-':>15} | {'-':>6} | {note}")
        else:
            flag = "" if pipe >= 3 * step else "  <3x"
            print(f"| {name:45} | {pipe:13,.0f} | {step:15,.0f} | {pipe / step:5.1f}x |{flag}")


if __name__ == "__main__":
    main()
