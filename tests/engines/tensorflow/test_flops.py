"""tpukit.engines.keras.flops: exact FLOP counts on hand-computed models, the TPU peak table, the measured CPU peak and its cache."""

import json
import time

import keras
import pytest
from keras import layers

from tpukit.engines.keras import flops
from tpukit.engines.tensorflow import flops as tf_flops


def _dense_model():
    inputs = keras.Input((8,))
    x = layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, layers.Dense(4)(x))


# Forward matrix FLOPs of `_dense_model`, one example: 2*in*out per Dense (biases and relu are not matrix ops).
DENSE_FORWARD = 2 * 8 * 16 + 2 * 16 * 4  # 384


def _conv_model():
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(4, 3, padding="same", activation="relu")(
        inputs
    )  # 8x8x4 outputs, 3*3*3 MACs each
    x = layers.MaxPooling2D(2)(x)  # 4x4x4
    x = layers.Conv2D(6, 3, padding="valid")(x)  # 2x2x6 outputs, 3*3*4 MACs each
    x = layers.Flatten()(x)  # 24
    return keras.Model(inputs, layers.Dense(10)(x))


CONV_FORWARD = (
    2 * (8 * 8 * 4) * (3 * 3 * 3) + 2 * (2 * 2 * 6) * (3 * 3 * 4) + 2 * 24 * 10
)  # 13824 + 1728 + 480


def test_dense_model_counts_2_in_out_per_layer_times_3_for_training():
    assert tf_flops.forward_flops(_dense_model()) == DENSE_FORWARD
    assert tf_flops.model_flops_per_example(_dense_model()) == 3 * DENSE_FORWARD


def test_conv_model_counts_every_output_times_kernel_volume():
    assert tf_flops.forward_flops(_conv_model()) == CONV_FORWARD == 16032
    assert tf_flops.model_flops_per_example(_conv_model()) == 3 * CONV_FORWARD


def test_count_is_per_example_and_independent_of_the_dtype_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # conftest resets it
    assert tf_flops.forward_flops(_conv_model()) == CONV_FORWARD


def test_einsum_ops_are_counted():
    # MultiHeadAttention emits Einsum ops, which TensorFlow's flops registry does not know.
    inputs = keras.Input((5, 8))
    outputs = layers.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    model = keras.Model(inputs, outputs)
    projections = 3 * (2 * 5 * 8 * (2 * 4))  # q, k, v: 8 -> 2 heads x 4, at 5 positions
    attention = 2 * (2 * 5 * 5 * 2 * 4)  # scores and context: 5x5 per head, contracted over 4
    output = 2 * 5 * (2 * 4) * 8
    assert tf_flops.forward_flops(model) == projections + attention + output == 3360


def test_model_built_under_a_strategy(strategy_2):
    with strategy_2.scope():
        model = _dense_model()
    assert tf_flops.model_flops_per_example(model) == 3 * DENSE_FORWARD


def test_uncountable_models_give_none_not_an_error(caplog):
    class Subclassed(keras.Model):
        def call(self, x):
            return x

    dynamic_inputs = keras.Input((None, 8))
    dynamic = keras.Model(dynamic_inputs, layers.Dense(2)(dynamic_inputs))
    with caplog.at_level("WARNING", logger="tpukit"):
        assert tf_flops.model_flops_per_example(Subclassed()) is None
        assert tf_flops.model_flops_per_example(dynamic) is None
    assert "no symbolic inputs" in caplog.text and "dynamic shape" in caplog.text


@pytest.mark.parametrize(
    "kind, generation",
    [
        ("TPU v2", "v2"),
        ("v2-8", "v2"),
        ("TPU v3", "v3"),
        ("v3-32", "v3"),
        ("TPU v4", "v4"),
        ("v4-8", "v4"),
        ("TPU v5 lite", "v5e"),
        ("TPU v5e", "v5e"),
        ("v5litepod-16", "v5e"),
        ("TPU v5", "v5p"),
        ("v5p-8", "v5p"),
        ("TPU v6 lite", "v6e"),
        ("v6e-1", "v6e"),
        ("TPU7x", "tpu7x"),
        ("tpu7x-8", "tpu7x"),
        ("TPU v7x", "tpu7x"),
        ("TPU v9", None),
        ("", None),
        (None, None),
        ("CPU", None),
    ],
)
def test_tpu_generation(kind, generation):
    assert flops.tpu_generation(kind) == generation


def test_tpu_peak_is_per_chip_divided_over_tensorflow_devices():
    # A v3-8: 4 chips, 8 TensorFlow devices (2 TensorCores per chip) -> 4 * 123 TFLOP/s.
    peak, source = flops.device_peak_flops("tpu", "v3-8", 8)
    assert peak == pytest.approx(4 * 123e12)
    assert "v3" in source and "123" in source
    # A v4-8: 4 chips, 4 devices (megacore) -> 4 * 275 TFLOP/s. A v5e-4: 4 chips of 197.
    assert flops.device_peak_flops("tpu", "TPU v4", 4)[0] == pytest.approx(4 * 275e12)
    assert flops.device_peak_flops("tpu", "v5litepod-4", 4)[0] == pytest.approx(4 * 197e12)
    assert flops.device_peak_flops("tpu", "v6e-8", 8)[0] == pytest.approx(8 * 918e12)
    assert flops.device_peak_flops("tpu", "v5p-8", 4)[0] == pytest.approx(4 * 459e12)
    # TPU7x: 2307 TFLOP/s per chip over its two TensorCores (docs.cloud.google.com/tpu/docs/tpu7x).
    assert flops.device_peak_flops("tpu", "tpu7x-8", 8)[0] == pytest.approx(4 * 2307e12)


def test_every_generation_has_a_peak_and_a_device_count():
    assert set(flops.PEAK_BF16_FLOPS_PER_CHIP) == set(flops.TF_DEVICES_PER_CHIP)
    assert {"v2", "v3", "v4", "v5e", "v5p", "v6e", "tpu7x"} <= set(flops.PEAK_BF16_FLOPS_PER_CHIP)
    for generation in filter(None, flops.TPU_PCI_DEVICE_IDS.values()):
        assert generation in flops.PEAK_BF16_FLOPS_PER_CHIP


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_tpu_peak_is_bf16_for_every_precision_and_says_so(precision):
    peak, source = flops.device_peak_flops("tpu", "TPU v4", 4, precision=precision)
    assert peak == pytest.approx(4 * 275e12)
    assert "bfloat16 peak" in source and f"bf16 for {precision}" in source
    assert flops.peak_dtype(precision, "tpu") == "bfloat16"


def _fake_pci(root, devices):
    for name, (vendor, device) in devices.items():
        (root / name).mkdir()
        (root / name / "vendor").write_text(vendor + "\n")
        (root / name / "device").write_text(device + "\n")


@pytest.mark.parametrize(
    "devices, generation",
    [
        ({"0000:00:04.0": ("0x1ae0", "0x005e")}, "v4"),
        ({"0000:00:03.0": ("0x10de", "0x2330"), "0000:00:05.0": ("0x1ae0", "0x0063")}, "v5e"),
        ({"0000:00:05.0": ("0x1ae0", "0x006f")}, "v6e"),
        ({"0000:00:05.0": ("0x1ae0", "0x0027")}, None),  # v2 and v3 share this id: no guess
        ({"0000:00:05.0": ("0x10de", "0x005e")}, None),  # not Google's vendor id
        ({}, None),
    ],
)
def test_chip_generation_from_pci_ids(tmp_path, devices, generation):
    _fake_pci(tmp_path, devices)
    assert flops.pci_tpu_generation(str(tmp_path)) == generation


def test_tpu_kind_falls_back_from_env_to_device_details_to_pci(monkeypatch):
    import tensorflow as tf

    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    assert flops.detect_device_kind("tpu") == "v5litepod-8"
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE")
    fake_tpu = tf.config.PhysicalDevice("/physical_device:TPU:0", "TPU")
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda kind=None: [fake_tpu] if kind == "TPU" else []
    )
    monkeypatch.setattr(
        tf.config.experimental, "get_device_details", lambda device: {"device_kind": "TPU v4"}
    )
    assert flops.detect_device_kind("tpu") == "TPU v4"
    # TensorFlow documents device details for GPUs only: with none, the PCI ids decide.
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device: {})
    monkeypatch.setattr(flops, "pci_tpu_generation", lambda: "v6e")
    assert flops.detect_device_kind("tpu") == "v6e"
    assert flops.device_peak_flops("tpu", None, 8)[0] == pytest.approx(8 * 918e12)


def test_unknown_tpu_gives_none_and_says_why():
    peak, source = flops.device_peak_flops("tpu", "TPU v99", 8)
    assert peak is None
    assert "'TPU v99'" in source and "v6e" in source


def _timed_matmuls(monkeypatch, delay: float = 0.0):
    """Runs `measure_matmul_flops` with a spy on `tf.matmul` (the operand shapes, `delay` seconds added to each
    call) and the real clock; returns (rate, shapes of the timed matmuls, measured seconds of each interval)."""
    import tensorflow as tf

    calls = []
    real_matmul = tf.matmul

    def spy(a, b, *args, **kwargs):
        calls.append((tuple(a.shape), tuple(b.shape)))
        time.sleep(delay)
        return real_matmul(a, b, *args, **kwargs)

    stamps = []  # (clock, matmuls so far) at each reading of the timer

    def timer():
        stamps.append((time.perf_counter(), len(calls)))
        return stamps[-1][0]

    monkeypatch.setattr(tf, "matmul", spy)
    rate = flops.measure_matmul_flops(matrix_size=256, repeats=3, timer=timer)
    monkeypatch.undo()
    intervals = list(zip(stamps[::2], stamps[1::2], strict=True))
    # Each timed interval holds exactly one matmul: the warm-up is outside them.
    assert [after - before for (_, before), (_, after) in intervals] == [1, 1, 1]
    shapes = [calls[before] for (_, before), _ in intervals]
    return rate, shapes, [end - start for (start, _), (end, _) in intervals]


def test_measured_matmul_rate_is_the_flops_of_the_timed_matmul_over_its_best_time(monkeypatch):
    rate, shapes, seconds = _timed_matmuls(monkeypatch)
    # The FLOPs of the matmul that ran, from its operand shapes: (m x k) @ (k x n) is m*n*k multiply-adds.
    (m, k), (k2, n) = shapes[0]
    assert k == k2 and shapes == [shapes[0]] * 3 and (m, k, n) == (256, 256, 256)
    assert rate == pytest.approx(2 * m * k * n / min(seconds), rel=1e-9)


def test_a_slower_matmul_is_reported_at_a_lower_rate(monkeypatch):
    fast, _, _ = _timed_matmuls(monkeypatch)
    slow, _, seconds = _timed_matmuls(monkeypatch, delay=0.05)
    assert min(seconds) >= 0.05  # the delay is inside the timed interval
    assert slow <= 2 * 256**3 / 0.05
    assert slow < fast


def test_measured_rate_is_2n3_over_the_best_time():
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.75])  # durations 0.5, 0.25, 0.75: best is 0.25
    rate = flops.measure_matmul_flops(matrix_size=64, repeats=3, timer=lambda: next(ticks))
    assert rate == 2 * 64**3 / 0.25


def test_cpu_peak_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "peak_flops.json"
    peak, source = flops.device_peak_flops(
        "default", "CPU test-model", 1, cache_path=str(cache), matrix_size=128
    )
    assert peak > 0 and source.startswith("measured")
    stored = json.loads(cache.read_text())
    assert stored == {"CPU test-model | float32 matmul 128x128": peak}

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again although the cache has the value")

    monkeypatch.setattr(flops, "measure_matmul_flops", must_not_measure)
    again, source = flops.device_peak_flops(
        "default", "CPU test-model", 1, cache_path=str(cache), matrix_size=128
    )
    assert again == peak and source.startswith("cached")


def test_a_peak_below_a_rate_training_reached_is_timed_again_and_only_rises(tmp_path):
    cache = tmp_path / "peak.json"
    key = "CPU v | float32 matmul 64x64"
    cache.write_text(json.dumps({key: 1e10}))
    timings = []

    def measure(size, dtype):
        timings.append((size, dtype))
        return 3e10

    def peak(at_least, measure=measure):
        return flops.measured_peak_flops(
            "CPU v", str(cache), 64, measure=measure, at_least=at_least
        )

    assert peak(None) == (1e10, True) and peak(0.9e10) == (1e10, True) and timings == []
    assert peak(2e10) == (3e10, False) and timings == [(64, "float32")]
    assert json.loads(cache.read_text()) == {
        key: 3e10,
        f"{key} | first": 1e10,
        f"{key} | timed again for": 2e10,
    }
    # A second timing lower than the cache (still under load) never lowers it.
    assert peak(4e10, measure=lambda size, dtype: 2e10) == (3e10, False)
    assert json.loads(cache.read_text())[key] == 3e10
    # A model that beats the matmul at 4e10 is not timed again at every run's report.
    assert peak(4e10, measure=lambda size, dtype: 1 / 0) == (3e10, True)
    # steps_per_execution: auto decides with the first value timed here, whatever later timings found.
    assert peak(None) == (1e10, True) and len(timings) == 1


def test_a_first_timing_is_what_later_decisions_read(tmp_path):
    cache = tmp_path / "peak.json"
    timed = iter([5e10, 9e10])

    def measure(size, dtype):
        return next(timed)

    assert flops.measured_peak_flops("CPU w", str(cache), 64, measure=measure) == (5e10, False)
    assert flops.measured_peak_flops("CPU w", str(cache), 64, measure=measure) == (5e10, True)
    assert flops.measured_peak_flops("CPU w", str(cache), 64, measure=measure, at_least=6e10) == (
        9e10,
        False,
    )
    assert flops.measured_peak_flops("CPU w", str(cache), 64, measure=measure) == (5e10, True)


def test_reported_mfu_is_never_above_one():
    calls = []

    def remeasure(peak):
        def timed_again(achieved):
            calls.append(achieved)
            return peak, f"timed again: {peak:g}"

        return timed_again

    # 1e9 FLOPs per example at 150 examples/s is 1.5e11 FLOP/s against a cached peak of 1e11 (timed under load).
    assert flops.checked_mfu(1e9, 150, 1e11, "cached", remeasure(2e11)) == (
        0.75,
        2e11,
        "timed again: 2e+11",
    )
    assert calls == [1.5e11]
    value, peak, source = flops.checked_mfu(1e9, 150, 1e11, "cached", remeasure(1.2e11))
    assert value is None and peak == 1.2e11
    assert "training ran at 150.0 GFLOP/s, above that peak" in source and "no MFU" in source
    # Below 1 nothing is timed again; a TPU's table peak (no remeasure) is reported as computed.
    calls.clear()
    assert flops.checked_mfu(1e9, 50, 1e11, "cached", remeasure(2e11)) == (0.5, 1e11, "cached")
    assert calls == []
    assert flops.checked_mfu(1e9, 150, 1e11, "table", None) == (1.5, 1e11, "table")
    assert flops.checked_mfu(None, 150, 1e11, "cached", remeasure(2e11)) == (None, 1e11, "cached")


def test_virtual_cpu_devices_share_one_host_peak(tmp_path):
    cache = tmp_path / "peak.json"
    cache.write_text(json.dumps({"CPU x | float32 matmul 2048x2048": 1e11}))
    # The conftest makes 8 virtual CPUs of one host: 8 replicas over them are still one CPU's peak.
    assert flops.device_peak_flops("mirrored", "CPU x", 8, cache_path=str(cache))[0] == 1e11
    assert flops.device_peak_flops("default", "CPU x", 1, cache_path=str(cache))[0] == 1e11


def test_cpu_peak_is_measured_in_the_training_dtype(tmp_path):
    cache = tmp_path / "peak.json"
    cache.write_text(
        json.dumps({"CPU z | float32 matmul 64x64": 1e10, "CPU z | bfloat16 matmul 64x64": 3e10})
    )
    f32, f32_source = flops.device_peak_flops(
        "default", "CPU z", 1, cache_path=str(cache), matrix_size=64
    )
    bf16, bf16_source = flops.device_peak_flops(
        "default", "CPU z", 1, cache_path=str(cache), matrix_size=64, precision="mixed_bfloat16"
    )
    assert (f32, bf16) == (1e10, 3e10)
    assert "float32 64x64 matmul" in f32_source and "bfloat16 64x64 matmul" in bf16_source
    assert flops.peak_dtype("mixed_float16", "mirrored") == "float16"
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        flops.device_peak_flops("default", "CPU z", 1, cache_path=str(cache), precision="fp8")


def test_a_bf16_matmul_is_measured_for_real(tmp_path):
    peak, source = flops.device_peak_flops(
        "default",
        "CPU w",
        1,
        cache_path=str(tmp_path / "p.json"),
        matrix_size=64,
        precision="mixed_bfloat16",
    )
    assert peak > 0 and source.startswith("measured bfloat16")
    assert list(json.loads((tmp_path / "p.json").read_text())) == ["CPU w | bfloat16 matmul 64x64"]


def test_a_corrupt_cache_is_remeasured(tmp_path):
    cache = tmp_path / "peak.json"
    cache.write_text("{not json")
    peak, source = flops.device_peak_flops(
        "default", "CPU y", 1, cache_path=str(cache), matrix_size=64
    )
    assert peak > 0 and source.startswith("measured")
    assert json.loads(cache.read_text())["CPU y | float32 matmul 64x64"] == peak


def test_detected_cpu_kind_names_the_processor():
    kind = flops.detect_device_kind("default")
    assert kind.startswith("CPU ") and "logical cores" in kind


def test_bad_num_devices_is_refused():
    with pytest.raises(ValueError, match="num_devices=0.*strategy.num_replicas_in_sync"):
        flops.device_peak_flops("tpu", "v4-8", 0)


def test_mfu():
    assert flops.mfu(3e9, 100.0, 1e12) == pytest.approx(0.3)
    assert flops.mfu(None, 100.0, 1e12) is None
    assert flops.mfu(3e9, None, 1e12) is None
    assert flops.mfu(3e9, 100.0, None) is None
    assert flops.mfu(3e9, 100.0, 0.0) is None
