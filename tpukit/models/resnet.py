"""ResNet v1.5 for CIFAR-size (`resnet_cifar`) and ImageNet-size (`resnet50`) images.

v1.5 (as in TF Model Garden and MLPerf) puts the downsampling stride on the 3x3 convolution of a bottleneck
instead of the first 1x1, which is slightly more accurate. Options TPU recipes rely on:

* `zero_init_residual`: the last BatchNorm of each residual branch starts with gamma = 0, so every block starts as
  the identity; this is what makes large-batch (LARS, batch 4k+) ResNet training converge (Goyal et al., 2017).
* `bn_momentum` / `bn_epsilon`: Keras defaults to 0.99 / 1e-3; the reference ResNet recipes use 0.9 / 1e-5.

There is deliberately no `weight_decay` argument and no kernel regularizer: weight decay belongs to the optimizer
(`train.weight_decay`), which also knows to skip BatchNorm parameters and biases.
"""

from __future__ import annotations

import keras
from keras import layers


class _Norms:
    """Makes BatchNorm layers with the model's momentum/epsilon, so the options apply to every one of them."""

    def __init__(self, momentum: float, epsilon: float, zero_init_residual: bool):
        self.momentum = momentum
        self.epsilon = epsilon
        self.zero_init_residual = zero_init_residual

    def __call__(self, name: str, last_in_branch: bool = False) -> layers.BatchNormalization:
        gamma = "zeros" if last_in_branch and self.zero_init_residual else "ones"
        return layers.BatchNormalization(
            momentum=self.momentum, epsilon=self.epsilon, gamma_initializer=gamma, name=name
        )


def _conv(filters: int, kernel_size: int, strides: int, name: str) -> layers.Conv2D:
    # No bias: the BatchNorm right after has its own offset.
    return layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name=name,
    )


def _shortcut(x, filters: int, strides: int, norm: _Norms, name: str):
    if strides == 1 and x.shape[-1] == filters:
        return x
    x = _conv(filters, 1, strides, f"{name}_proj_conv")(x)
    return norm(f"{name}_proj_bn")(x)


def _basic_block(x, filters: int, strides: int, norm: _Norms, name: str):
    shortcut = _shortcut(x, filters, strides, norm, name)
    x = _conv(filters, 3, strides, f"{name}_conv1")(x)
    x = layers.ReLU(name=f"{name}_relu1")(norm(f"{name}_bn1")(x))
    x = _conv(filters, 3, 1, f"{name}_conv2")(x)
    x = norm(f"{name}_bn2", last_in_branch=True)(x)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([shortcut, x]))


def _bottleneck_block(x, filters: int, strides: int, norm: _Norms, name: str):
    shortcut = _shortcut(x, 4 * filters, strides, norm, name)
    x = _conv(filters, 1, 1, f"{name}_conv1")(x)
    x = layers.ReLU(name=f"{name}_relu1")(norm(f"{name}_bn1")(x))
    x = _conv(filters, 3, strides, f"{name}_conv2")(x)  # v1.5: the stride is here, not on conv1
    x = layers.ReLU(name=f"{name}_relu2")(norm(f"{name}_bn2")(x))
    x = _conv(4 * filters, 1, 1, f"{name}_conv3")(x)
    x = norm(f"{name}_bn3", last_in_branch=True)(x)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([shortcut, x]))


def _head(x, num_classes: int):
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return layers.Dense(num_classes, dtype="float32", name="logits")(x)


def resnet_cifar(
    depth: int = 20,
    num_classes: int = 10,
    input_shape: tuple[int, ...] = (32, 32, 3),
    width: int = 16,
    zero_init_residual: bool = True,
    bn_momentum: float = 0.9,
    bn_epsilon: float = 1e-5,
) -> keras.Model:
    """ResNet-`depth` for 32x32 images (He et al., 2016, section 4.2): 3 stages of basic blocks.

    Stages have `width`, 2*`width`, 4*`width` filters (16/32/64 by default) and (depth - 2) / 6 blocks each; the
    first block of stages 2 and 3 downsamples with stride 2 and a 1x1 projection shortcut.

    Args:
        depth: 6n + 2: 20, 32, 44, 56, 110, ...
        num_classes: number of output logits.
        input_shape: `(height, width, channels)`.
        width: filters of the first stage.
        zero_init_residual: start the last BatchNorm gamma of every block at 0 (each block starts as identity).
        bn_momentum: BatchNorm moving-average momentum.
        bn_epsilon: BatchNorm epsilon.
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(
            f"resnet_cifar: depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...); received depth={depth}. "
            "Fix: pick one of those depths."
        )
    blocks = (depth - 2) // 6
    norm = _Norms(bn_momentum, bn_epsilon, zero_init_residual)
    images = keras.Input(shape=tuple(input_shape), name="image")
    x = _conv(width, 3, 1, "stem_conv")(images)
    x = layers.ReLU(name="stem_relu")(norm("stem_bn")(x))
    for stage in range(3):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(
                x, width * 2**stage, strides, norm, f"stage{stage + 1}_block{block + 1}"
            )
    return keras.Model(images, _head(x, num_classes), name=f"resnet{depth}_cifar")


def resnet50(
    num_classes: int = 1000,
    input_shape: tuple[int, ...] = (224, 224, 3),
    zero_init_residual: bool = True,
    bn_momentum: float = 0.9,
    bn_epsilon: float = 1e-5,
) -> keras.Model:
    """ResNet-50 v1.5 for ImageNet-size images: 7x7/2 stem, 3x3/2 max pool, bottleneck stages of 3, 4, 6, 3 blocks.

    Args:
        num_classes: number of output logits.
        input_shape: `(height, width, channels)`; 224x224 for ImageNet, anything >= 32x32 works.
        zero_init_residual: start the last BatchNorm gamma of every block at 0 (each block starts as identity).
        bn_momentum: BatchNorm moving-average momentum.
        bn_epsilon: BatchNorm epsilon.
    """
    norm = _Norms(bn_momentum, bn_epsilon, zero_init_residual)
    images = keras.Input(shape=tuple(input_shape), name="image")
    x = _conv(64, 7, 2, "stem_conv")(images)
    x = layers.ReLU(name="stem_relu")(norm("stem_bn")(x))
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    for stage, (filters, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _bottleneck_block(x, filters, strides, norm, f"stage{stage + 1}_block{block + 1}")
    return keras.Model(images, _head(x, num_classes), name="resnet50")
