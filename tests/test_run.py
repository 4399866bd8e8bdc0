"""run() in-process: resume from a checkpoint, a 2-replica run on 2 virtual CPUs, batch-size checks."""

import glob
import json
import zipfile

import faults
import pytest
from conftest import mirrored
from helpers import digits_recipe

from tpukit.recipe import RecipeError, from_dict
from tpukit.runner import run


def recipe(**overrides):
    base = {
        "train.epochs": 1,
        "data.global_batch_size": 32,
        "train.warmup_steps": 5,
        "runtime.verbose": 0,
    }
    return from_dict(digits_recipe(**{**base, **overrides}), "digits_cnn.yaml")


@pytest.mark.integration
def test_resume_continues_from_the_last_checkpoint(tmp_path):
    first = run(recipe(), str(tmp_path))
    assert first["resumed_from_step"] == 0 and first["step"] == 44
    # digits_cnn's cosine schedule spans the run: more epochs change it, so the change is accepted by name
    second = run(recipe(**{"train.epochs": 2}), str(tmp_path), accept_changes=["train.epochs"])
    assert second["resumed_from_step"] == 44  # the first epoch was not trained again
    assert second["step"] == 88
    assert second["eval"]["accuracy"] >= 0.5


@pytest.mark.integration
def test_two_replicas_on_two_virtual_cpus(tmp_path):
    metrics = run(recipe(**{"train.epochs": 2}), str(tmp_path), strategy=mirrored(2))
    assert metrics["replicas"] == 2 and metrics["strategy"] == "MirroredStrategy"
    assert metrics["jit_compile"] is False  # XLA cannot span the replicas of a MirroredStrategy
    assert metrics["step"] == 2 * (1437 // 32)
    assert metrics["eval_examples"] == 360
    assert metrics["eval"]["accuracy"] > 0.5
    # Exact over the 360 images although the last global batch is padded and split over 2 replicas:
    # recompute accuracy and cross-entropy from the exported model on the raw test split.
    import keras
    import numpy as np

    from tpukit.data.sources import _digits_split

    x, y = _digits_split("test", 0.2)
    logits = keras.saving.load_model(str(tmp_path / "model.keras")).predict(x, verbose=0)
    log_probs = (
        logits
        - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
        - logits.max(1, keepdims=True)
    )
    assert metrics["eval"]["accuracy"] == pytest.approx(
        float(np.mean(logits.argmax(1) == y)), abs=1e-6
    )
    assert metrics["eval"]["cross_entropy"] == pytest.approx(
        float(-log_probs[np.arange(len(y)), y].mean()), abs=1e-4
    )


def test_global_batch_that_does_not_divide_by_replicas_shows_both_numbers(tmp_path):
    with pytest.raises(RecipeError) as info:
        run(recipe(**{"data.global_batch_size": 63}), str(tmp_path / "out"), strategy=mirrored(2))
    assert "data.global_batch_size=63 does not divide by the 2 replicas" in str(info.value)
    assert "--set data.global_batch_size=62" in str(info.value)
    assert not (tmp_path / "out").exists()  # nothing written before validation passed


@pytest.mark.slow  # the default tier has tests/engines/tensorflow/test_loop.py's 2-replica multi-step case
def test_steps_per_execution_on_two_replicas_matches_the_step_count_and_checkpoints(tmp_path):
    # Stock Keras 3.15 fails here ("You must feed a value for placeholder tensor"); tpukit's loop does not.
    metrics = run(
        recipe(**{"runtime.steps_per_execution": 4, "runtime.checkpoint_every_steps": 20}),
        str(tmp_path),
        strategy=mirrored(2),
    )
    assert metrics["step"] == 44 and metrics["replicas"] == 2
    assert metrics["eval"]["accuracy"] > 0.5
    saved = sorted(
        int(p.split("-")[-1].split(".")[0])
        for p in glob.glob(str(tmp_path / "checkpoints" / "ckpt-*.index"))
    )
    assert saved == [
        20,
        40,
        44,
    ]  # every 20 steps at execution boundaries (multiples of 4), and the epoch end


def test_steps_per_execution_that_does_not_divide_the_epoch_lists_the_divisors(tmp_path):
    with pytest.raises(RecipeError) as info:
        run(recipe(**{"runtime.steps_per_execution": 3}), str(tmp_path / "out"))
    assert "steps_per_execution=3 does not divide steps_per_epoch=44" in str(info.value)
    assert "1, 2, 4, 11, 22, 44" in str(info.value)


@pytest.mark.integration
def test_auto_steps_per_execution_is_decided_from_the_model_and_recorded(tmp_path):
    import numpy as np
    from helpers import model_weights

    from tpukit.planner import steps

    auto = {"runtime.steps_per_execution": "auto", "data.deterministic": True}
    first = run(recipe(**auto), str(tmp_path / "first"))
    second = run(recipe(**auto), str(tmp_path / "second"))
    chosen, why = first["steps_per_execution"], first["steps_per_execution_decision"]
    assert isinstance(chosen, int) and 44 % chosen == 0
    assert chosen > 1  # a digits step is a few MFLOP: several fit in the 0.5 s target
    # Nothing timed: the same recipe on the same machine decides the same, for the reason recorded.
    assert second["steps_per_execution"] == chosen
    assert second["steps_per_execution_decision"] == why
    assert why["chosen"] == chosen and why["flops_per_step"] > 0 and why["peak_flops"] > 0
    assert why["flops_per_step"] == first["flops_per_example"] * 32
    again, _ = steps.decide_steps_per_execution(
        flops_per_step=why["flops_per_step"],
        flops_per_second=why["peak_flops"],
        steps_per_epoch=44,
        target_seconds=why["target_seconds"],
    )
    assert again == chosen
    # model.keras keeps the value, as if compile had been given it.
    import json
    import zipfile

    with zipfile.ZipFile(tmp_path / "first" / "model.keras") as archive:
        saved = json.loads(archive.read("config.json"))["compile_config"]
    assert saved["steps_per_execution"] == chosen
    # No throwaway model trained first: the run is the one a fixed value gives, weight for weight.
    assert first["step"] == 44 and first["resumed_from_step"] == 0
    fixed = run(recipe(**{**auto, "runtime.steps_per_execution": chosen}), str(tmp_path / "fixed"))
    assert fixed["steps_per_execution_decision"] == {"setting": chosen, "rule": "set in the recipe"}
    for ours, theirs in zip(
        model_weights(tmp_path / "first" / "model.keras"),
        model_weights(tmp_path / "fixed" / "model.keras"),
        strict=True,
    ):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.integration
def test_the_whole_run_with_an_xla_compiled_train_step(tmp_path):
    # The TPU-readiness proxy: the full train step (model, loss, optimizer, metrics) compiles with XLA on the CPU.
    metrics = run(recipe(**{"runtime.jit_compile": True}), str(tmp_path))
    assert metrics["jit_compile"] is True
    assert metrics["eval"]["accuracy"] > 0.5


class LoopProbe:
    """Records whether fit ran tpukit's multi-step function or Keras' own."""

    def __new__(cls):
        import keras

        class Probe(keras.callbacks.Callback):
            ours = None

            def on_train_batch_end(self, batch, logs=None):
                if self.ours is None:
                    self.ours = getattr(self.model.train_function, "tpukit_multi_step", False)

        return Probe()


@pytest.mark.parametrize("replicas", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.integration
def test_runtime_loop_tpukit_trains_like_keras_own_loop(tmp_path, replicas):
    # The escape hatch for a TPU whose Keras loop fails: tpukit's loop on any strategy, same numbers as Keras'.
    import keras
    import numpy as np

    strategy = mirrored(2) if replicas == 2 else None
    results = {}
    for loop in ("keras", "tpukit"):
        probe = LoopProbe()
        overrides = {
            "runtime.loop": loop,
            "runtime.steps_per_execution": 4 if replicas == 1 else 1,
            "data.deterministic": True,
        }
        metrics = run(
            recipe(**overrides), str(tmp_path / loop), strategy=strategy, callbacks=[probe]
        )
        assert probe.ours is (loop == "tpukit") and metrics["step"] == 44
        results[loop] = keras.saving.load_model(str(tmp_path / loop / "model.keras")).get_weights()
    for a, b in zip(results["keras"], results["tpukit"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_runtime_loop_keras_where_keras_fails_is_refused_before_training(tmp_path):
    with pytest.raises(
        RecipeError,
        match="runtime.loop=keras on this strategy: Keras' fit fails with steps_per_execution",
    ):
        run(
            recipe(**{"runtime.loop": "keras", "runtime.steps_per_execution": 4}),
            str(tmp_path / "out"),
            strategy=mirrored(2),
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_peak_cached_under_load_is_timed_again_and_mfu_stays_at_most_one(tmp_path, monkeypatch):
    """A cached peak far below what the digits CNN reaches (as if timed under load) is timed again when the
    run reports, the cache rises to the new timing, and the reported MFU is against it (never above 1)."""
    import json

    from tpukit.engines.keras import flops

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    key = f"{flops.detect_device_kind('default')} | float32 matmul 2048x2048"
    cache = tmp_path / "cache" / "tpukit" / "peak_flops.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({key: 1e6}))  # 1 MFLOP/s: any training beats it
    metrics = run(recipe(), str(tmp_path / "run"))
    timed = json.loads(cache.read_text())[key]
    assert timed > 1e8 and metrics["peak_flops"] == timed
    assert metrics["peak_flops_source"].startswith("timed again float32 2048x2048 matmul peak")
    assert 0 < metrics["mfu"] <= 1


def _tiny_lm(eval_split=None, epochs=1, **runtime):
    return from_dict(
        {
            "model": {
                "name": "causal_lm",
                "vocab_size": 16,
                "sequence_length": 8,
                "num_layers": 1,
                "hidden_dim": 16,
                "num_heads": 2,
                "mlp_dim": 32,
            },
            "data": {
                "source": "synthetic",
                "input_shape": [8],
                "label_shape": [8],
                "integer_inputs": True,
                "num_classes": 16,
                "num_examples": 64,
                "global_batch_size": 16,
                "eval_split": eval_split,
                "shuffle_buffer": 1,
            },
            "train": {"epochs": epochs, "optimizer": "adam", "learning_rate": 0.001},
            "runtime": {"verbose": 0, **runtime},
        },
        "lm.yaml",
    )


@pytest.mark.integration
def test_a_resumed_run_and_eval_mode_choose_xla_as_the_recipes_training_did(tmp_path, monkeypatch):
    from tpukit.planner import hardware

    lm = _tiny_lm(eval_split="test", epochs=2)  # 8 steps
    with faults.signals_at_step(4):
        assert run(lm, str(tmp_path))["status"] == "preempted"
    resumed = run(lm, str(tmp_path))
    evaluated = run(lm, str(tmp_path), mode="eval")
    assert resumed["resumed_from_step"] == 4 and resumed["step"] == 8
    assert resumed["jit_compile"] is evaluated["jit_compile"] is False
    # the estimate is of the recipe's whole training run, not of what is left of it (4 steps, then none)
    for metrics in (resumed, evaluated):
        assert "its 8 training steps are estimated at" in metrics["jit_compile_reason"]
    monkeypatch.setattr(hardware, "XLA_CPU_COMPILE_SECONDS", 0.0)
    assert run(lm, str(tmp_path), mode="eval")["jit_compile"] is True


@pytest.mark.integration
def test_a_cpu_run_compiles_an_attention_model_with_xla_and_a_cnn_without(tmp_path, monkeypatch):
    from tpukit.engines.tensorflow import sparse
    from tpukit.planner import hardware

    asked = []
    original = sparse.combine_repeated_ids
    monkeypatch.setattr(
        sparse,
        "combine_repeated_ids",
        lambda optimizer, dense=False: asked.append(dense) or original(optimizer, dense),
    )
    # 4 steps of a tiny model: XLA's compile would cost more than it saves
    short = run(_tiny_lm(), str(tmp_path / "short"))
    assert asked == [False] and short["jit_compile"] is False
    assert "attention layers (SelfAttention)" in short["jit_compile_reason"]
    assert "its 4 training steps are estimated at" in short["jit_compile_reason"]
    assert "a run this short trains faster without XLA" in short["jit_compile_reason"]
    # a compile that costs nothing stands for a run long enough to earn it back
    monkeypatch.setattr(hardware, "XLA_CPU_COMPILE_SECONDS", 0.0)
    metrics = run(_tiny_lm(), str(tmp_path / "lm"))
    assert asked == [
        False,
        True,
    ]  # the repeated token ids are summed densely: the step is compiled with XLA
    assert metrics["jit_compile"] is True
    assert "attention layers (SelfAttention)" in metrics["jit_compile_reason"]
    assert "more than the ~0 s its compile takes" in metrics["jit_compile_reason"]
    # model.keras keeps the choice in its compile config, as if compile had been given it
    with zipfile.ZipFile(tmp_path / "lm" / "model.keras") as saved:
        config = json.loads(saved.read("config.json"))
    assert config["compile_config"]["jit_compile"] is True
    cnn = run(recipe(), str(tmp_path / "cnn"))
    assert asked == [False, True, False]
    assert cnn["jit_compile"] is False and "no MultiHeadAttention" in cnn["jit_compile_reason"]
    # tpukit's own step loop compiles no XLA: auto says so
    own_loop = run(_tiny_lm(loop="tpukit", steps_per_execution=2), str(tmp_path / "loop"))
    assert (
        own_loop["jit_compile"] is False
        and "runtime.loop: tpukit" in own_loop["jit_compile_reason"]
    )
    # the recipe's own setting is kept
    own = run(_tiny_lm(jit_compile=False), str(tmp_path / "own"))
    assert own["jit_compile"] is False and own["jit_compile_reason"] == "set in the recipe"
