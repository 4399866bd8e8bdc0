"""Image preprocessing in pure TensorFlow (runs on the host inside tf.data): crops, flips, normalisation.

Every function takes one image `[height, width, channels]` (any integer or float dtype, values in [0, 255]) and
returns float32 with a static shape, so the batches built from it have static shapes (TPUs compile for one shape).

    image = preprocess(image, (224, 224), training=True)   # random crop + flip, normalised
"""

from __future__ import annotations

from typing import Literal

import tensorflow as tf

Augment = Literal["none", "flip", "crop", "crop_flip"]
Normalize = Literal["unit", "symmetric", "imagenet"]

AUGMENTS = ("none", "flip", "crop", "crop_flip")
NORMALIZES = ("unit", "symmetric", "imagenet")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def check_choices(source: str, augment: str, normalize: str, image_size) -> None:
    """Raises ValueError naming the argument, the value received and the valid choices."""
    if augment not in AUGMENTS:
        raise ValueError(
            f"{source}: augment must be one of {', '.join(AUGMENTS)}; received augment={augment!r}."
        )
    if normalize not in NORMALIZES:
        raise ValueError(
            f"{source}: normalize must be one of {', '.join(NORMALIZES)}; received normalize={normalize!r}."
        )
    if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
        raise ValueError(
            f"{source}: image_size must be [height, width] of positive integers; received image_size={image_size!r}. "
            "Fix: e.g. image_size: [224, 224]."
        )


def random_resized_crop(
    image: tf.Tensor, size: tuple[int, int], min_area: float = 0.08
) -> tf.Tensor:
    """Inception-style crop: a random box covering `min_area`..100% of the image (aspect 3/4..4/3), resized."""
    whole_image = tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4])
    begin, crop_size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=whole_image,
        min_object_covered=min_area,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_area, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    crop = tf.slice(image, begin, crop_size)
    return tf.image.resize(crop, size)


def pad_and_random_crop(image: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    """CIFAR-style crop for images already at `size`: zero-pad by size/8 on each side, crop `size` at random."""
    height, width = size
    pad_h, pad_w = max(1, height // 8), max(1, width // 8)
    padded = tf.image.resize_with_crop_or_pad(image, height + 2 * pad_h, width + 2 * pad_w)
    return tf.cast(tf.image.random_crop(padded, [height, width, tf.shape(image)[-1]]), tf.float32)


def random_crop(image: tf.Tensor, size: tuple[int, int], min_area: float = 0.08) -> tf.Tensor:
    """`pad_and_random_crop` for images already at `size`, `random_resized_crop` for any other size."""
    same_size = tf.reduce_all(tf.shape(image)[:2] == tf.constant(size))
    return tf.cond(
        same_size,
        lambda: pad_and_random_crop(image, size),
        lambda: random_resized_crop(image, size, min_area),
    )


def center_crop(image: tf.Tensor, size: tuple[int, int], crop_fraction: float = 0.875) -> tf.Tensor:
    """Evaluation crop: images already at `size` are unchanged; others lose the border, then are resized.

    The central square of side `crop_fraction` x the shorter side is kept (0.875: 224 of 256, the ImageNet
    convention), then resized to `size`.
    """
    shape = tf.shape(image)
    height, width = shape[0], shape[1]

    def crop_and_resize():
        side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * crop_fraction, tf.int32)
        side = tf.maximum(side, 1)
        top, left = (height - side) // 2, (width - side) // 2
        return tf.image.resize(tf.image.crop_to_bounding_box(image, top, left, side, side), size)

    same_size = tf.reduce_all(tf.stack([height, width]) == tf.constant(size))
    return tf.cond(same_size, lambda: tf.cast(image, tf.float32), crop_and_resize)


def normalize(image: tf.Tensor, mode: Normalize = "unit") -> tf.Tensor:
    """Maps [0, 255] to float32: 'unit' -> [0, 1], 'symmetric' -> [-1, 1], 'imagenet' -> ImageNet mean/std."""
    image = tf.cast(image, tf.float32)
    if mode == "unit":
        return image / 255.0
    if mode == "symmetric":
        return image / 127.5 - 1.0
    channels = image.shape[-1]
    if channels != 3:
        raise ValueError(
            f"normalize='imagenet' needs 3 channels; received an image with {channels}. "
            "Fix: use normalize: unit (or symmetric) for grayscale images."
        )
    return (image / 255.0 - tf.constant(IMAGENET_MEAN)) / tf.constant(IMAGENET_STD)


def preprocess(
    image: tf.Tensor,
    size: tuple[int, int],
    training: bool,
    *,
    augment: Augment = "crop_flip",
    normalization: Normalize = "unit",
    min_crop_area: float = 0.08,
    eval_crop_fraction: float = 0.875,
) -> tf.Tensor:
    """The whole per-image transform: random crop/flip when training (per `augment`), center crop otherwise.

    Returns float32 `[size[0], size[1], channels]`; `channels` must be static (decode with `channels=`).
    """
    channels = image.shape[-1]
    if channels is None:
        raise ValueError(
            "preprocess: the channel dimension must be static. Fix: decode with channels=1 or 3."
        )
    size = (int(size[0]), int(size[1]))
    if training and augment in ("crop", "crop_flip"):
        image = random_crop(image, size, min_crop_area)
    else:
        image = center_crop(image, size, eval_crop_fraction)
    if training and augment in ("flip", "crop_flip"):
        image = tf.image.random_flip_left_right(image)
    image = tf.ensure_shape(image, (*size, channels))
    return normalize(image, normalization)
