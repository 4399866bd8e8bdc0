"""Image preprocessing: static output shapes, value ranges, crops that keep or resize, choices validated."""

import numpy as np
import pytest
import tensorflow as tf

from tpukit.data import images


def _image(height, width, channels=3, value=None):
    rng = np.random.default_rng(0)
    array = (
        rng.integers(0, 256, size=(height, width, channels))
        if value is None
        else np.full((height, width, channels), value)
    )
    return tf.constant(array, tf.uint8)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(32, 32), (50, 70), (20, 24)])
def test_preprocess_gives_static_float32_in_unit_range(training, shape):
    fn = tf.function(
        lambda image: images.preprocess(image, (32, 32), training, augment="crop_flip")
    )
    out = fn(_image(*shape))
    assert out.dtype == tf.float32 and tuple(out.shape) == (32, 32, 3)
    assert 0.0 <= float(tf.reduce_min(out)) and float(tf.reduce_max(out)) <= 1.0
    spec = fn.get_concrete_function(tf.TensorSpec([None, None, 3], tf.uint8)).structured_outputs
    assert spec.shape.as_list() == [32, 32, 3]


def test_eval_keeps_images_already_at_size_and_center_crops_others():
    image = _image(32, 32)
    np.testing.assert_allclose(
        images.center_crop(image, (32, 32)).numpy(), image.numpy().astype(np.float32)
    )
    big = np.zeros((64, 64, 1), np.uint8)
    big[16:48, 16:48] = 255  # a white centre: a 0.5 center crop keeps only white
    assert (
        float(tf.reduce_min(images.center_crop(tf.constant(big), (8, 8), crop_fraction=0.5)))
        == 255.0
    )


def test_normalize_modes():
    white = _image(2, 2, value=255)
    assert float(tf.reduce_max(images.normalize(white, "unit"))) == 1.0
    assert float(tf.reduce_min(images.normalize(_image(2, 2, value=0), "symmetric"))) == -1.0
    np.testing.assert_allclose(
        images.normalize(white, "imagenet")[0, 0].numpy(),
        (1 - np.array(images.IMAGENET_MEAN)) / np.array(images.IMAGENET_STD),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="normalize='imagenet' needs 3 channels"):
        images.normalize(_image(2, 2, channels=1), "imagenet")


def test_training_crops_differ_between_calls():
    image = _image(32, 32)
    crops = [images.preprocess(image, (32, 32), True, augment="crop").numpy() for _ in range(4)]
    assert any(not np.array_equal(crops[0], c) for c in crops[1:])


def test_bad_choices_name_the_argument():
    with pytest.raises(
        ValueError,
        match="augment must be one of none, flip, crop, crop_flip; received augment='rotate'",
    ):
        images.check_choices("src", "rotate", "unit", None)
    with pytest.raises(
        ValueError, match=r"image_size must be \[height, width\].*received image_size=\(32,\)"
    ):
        images.check_choices("src", "none", "unit", (32,))
