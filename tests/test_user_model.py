"""Your own Keras model and data in tpukit's trainer: `module:function` names in YAML, `register_model` /
`register_source`, and `tpukit.fit` in Python, with SIGTERM resume on 1 and 2 replicas (issue 9)."""

import json
import textwrap

import faults
import numpy as np
import pytest
from conftest import mirrored

import tpukit
from tpukit.recipe import RecipeError, from_dict

PACKAGE = {
    "__init__.py": "",
    "models.py": textwrap.dedent("""
        import keras

        def build_model(hidden: int = 16, num_classes: int = 2) -> keras.Model:
            return keras.Sequential([keras.Input((4,)), keras.layers.Dense(hidden, activation="relu"),
                                     keras.layers.Dense(num_classes)])
    """),
    "data.py": textwrap.dedent("""
        import numpy as np
        import tensorflow as tf
        from tpukit.data import shard

        def my_source(split="train", input_context=None, size: int = 512):
            x = np.random.RandomState(0 if split == "train" else 1).randn(size, 4).astype("float32")
            y = (x.sum(1) > 0).astype("int32")
            return shard(tf.data.Dataset.from_tensor_slices((x, y)), input_context)
    """),
}


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    root = tmp_path / "src"
    (root / "my_pkg").mkdir(parents=True)
    for name, text in PACKAGE.items():
        (root / "my_pkg" / name).write_text(text)
    monkeypatch.syspath_prepend(str(root))
    import sys

    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        monkeypatch.delitem(sys.modules, name)  # each test's package is a fresh one
    return root


def user_recipe(**train):
    return from_dict(
        {
            "model": {"name": "my_pkg.models:build_model", "hidden": 8},
            "data": {
                "source": "my_pkg.data:my_source",
                "global_batch_size": 32,
                "size": 256,
                "eval_split": "test",
            },
            "train": {"epochs": 2, "learning_rate": 0.01, **train},
            "runtime": {"verbose": 0},
        },
        "user.yaml",
    )


@pytest.mark.parametrize("replicas", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.integration
def test_a_user_model_and_source_by_module_path_train_and_resume_after_sigterm(
    tmp_path, user_package, replicas
):
    strategy = mirrored(2) if replicas == 2 else None
    whole = tpukit.run(user_recipe(), str(tmp_path / "whole"), strategy=strategy)
    assert whole["step"] == 16 and whole["eval_examples"] == 256 and whole["eval"]["accuracy"] > 0.6
    with faults.signals_at_step(5):
        cut = tpukit.run(user_recipe(), str(tmp_path / "cut"), strategy=strategy)
    assert cut["status"] == "preempted"
    resumed = tpukit.run(user_recipe(), str(tmp_path / "cut"), strategy=strategy)
    assert resumed["resumed_from_step"] == 5 and resumed["step"] == 16
    # The saved recipe names the importable functions, so `python -m tpukit.train` can rerun it.
    assert "my_pkg.models:build_model" in (tmp_path / "cut" / "recipe.yaml").read_text()


def test_module_paths_are_validated_like_built_ins(user_package):
    with pytest.raises(RecipeError, match="unknown key model.width"):
        from_dict(
            {
                "model": {"name": "my_pkg.models:build_model", "width": 3},
                "data": {"source": "digits", "global_batch_size": 8},
                "train": {"epochs": 1, "learning_rate": 0.1},
            }
        )
    with pytest.raises(RecipeError, match="cannot be imported .*Fix: check the spelling"):
        from_dict(
            {
                "model": {"name": "my_pkg.nowhere:build"},
                "data": {"source": "digits", "global_batch_size": 8},
                "train": {"epochs": 1, "learning_rate": 0.1},
            }
        )


def test_register_model_and_source_make_names_for_recipes(user_package):
    import my_pkg.data
    import my_pkg.models

    tpukit.register_model("tiny_mlp", my_pkg.models.build_model)
    tpukit.register_source("tiny_data")(my_pkg.data.my_source)
    recipe = from_dict(
        {
            "model": {"name": "tiny_mlp", "hidden": 4},
            "data": {"source": "tiny_data", "global_batch_size": 16, "size": 64},
            "train": {"epochs": 1, "learning_rate": 0.01},
        }
    )
    assert recipe.model.kwargs == {"hidden": 4} and recipe.data.options == {"size": 64}


def _arrays():
    rng = np.random.RandomState(0)
    x = rng.randn(512, 4).astype("float32")
    return x, (x.sum(1) > 0).astype("int32")


def build():
    import keras

    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
    )


@pytest.mark.parametrize("replicas", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.integration
def test_fit_trains_your_model_on_arrays_and_resumes_after_sigterm(tmp_path, replicas):
    x, y = _arrays()
    strategy = mirrored(2) if replicas == 2 else None
    kwargs = dict(
        validation_data=(x[:100], y[:100]),
        epochs=2,
        batch_size=64,
        strategy=strategy,
        steps_per_execution=4,
        verbose=0,
        deterministic=True,
    )
    whole = tpukit.fit(build, x, y, output_dir=str(tmp_path / "whole"), **kwargs)
    assert (
        whole["step"] == 16 and whole["steps_per_execution"] == 4 and whole["eval_examples"] == 100
    )
    # eval loss is exact although 100 examples take 2 steps (the second completed with zero-weight examples) in an
    # execution of 4 that ends early where the finite pass ends
    assert whole["eval"]["loss"] == pytest.approx(whole["eval"]["cross_entropy"], abs=1e-5)
    with faults.signals_at_step(4):
        cut = tpukit.fit(build, x, y, output_dir=str(tmp_path / "cut"), **kwargs)
    assert cut["status"] == "preempted"
    resumed = tpukit.fit(build, x, y, output_dir=str(tmp_path / "cut"), **kwargs)
    assert resumed["resumed_from_step"] == 4 and resumed["step"] == 16
    assert resumed["eval"]["accuracy"] == pytest.approx(whole["eval"]["accuracy"], abs=1e-6)
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["status"] == "done"


def test_fit_takes_a_dataset_function_and_refuses_unknown_settings(tmp_path):
    import tensorflow as tf

    x, y = _arrays()

    def dataset_fn(split):
        return tf.data.Dataset.from_tensor_slices((x, y) if split == "train" else (x[:64], y[:64]))

    metrics = tpukit.fit(
        build,
        dataset_fn=dataset_fn,
        validation_data=True,
        epochs=1,
        batch_size=64,
        output_dir=str(tmp_path / "ds"),
        verbose=0,
    )
    assert metrics["step"] == 8 and metrics["eval_examples"] == 64
    with pytest.raises(RecipeError, match="unknown setting 'stepz_per_execution'"):
        tpukit.fit(
            build,
            x,
            y,
            epochs=1,
            batch_size=64,
            output_dir=str(tmp_path / "bad"),
            stepz_per_execution=2,
        )
    assert not (tmp_path / "bad").exists()


def test_a_source_or_builder_of_the_wrong_shape_is_a_recipe_error(tmp_path, user_package):
    (user_package / "my_pkg" / "bad.py").write_text(
        textwrap.dedent("""
        import numpy as np

        def no_context(split="train"):
            return None

        def arrays(split="train", input_context=None):
            return np.zeros((4, 4)), np.zeros(4)

        def nothing(hidden: int = 3):
            return None
    """)
    )
    base = {
        "data": {"source": "my_pkg.data:my_source", "global_batch_size": 32, "size": 64},
        "train": {"epochs": 1, "learning_rate": 0.01},
        "runtime": {"verbose": 0},
    }
    with pytest.raises(RecipeError, match="does not take input_context"):
        from_dict(
            {
                **base,
                "model": {"name": "my_pkg.models:build_model"},
                "data": {**base["data"], "source": "my_pkg.bad:no_context"},
            }
        )
    with pytest.raises(
        RecipeError, match="returned a tuple for split 'train', not a tf.data.Dataset"
    ):
        tpukit.plan(
            from_dict(
                {
                    **base,
                    "model": {"name": "my_pkg.models:build_model"},
                    "data": {"source": "my_pkg.bad:arrays", "global_batch_size": 2},
                }
            ),
            output_dir=str(tmp_path / "a"),
        )
    with pytest.raises(RecipeError, match="returned a NoneType, not a keras.Model"):
        tpukit.run(
            from_dict({**base, "model": {"name": "my_pkg.bad:nothing"}}), str(tmp_path / "b")
        )
    assert not (tmp_path / "b").exists()


def test_a_model_that_does_not_fit_its_data_is_refused_before_anything_is_written(
    tmp_path, user_package
):
    base = {
        "data": {"source": "my_pkg.data:my_source", "global_batch_size": 32, "size": 64},
        "train": {"epochs": 1, "learning_rate": 0.01},
        "runtime": {"verbose": 0},
    }
    (user_package / "my_pkg" / "wide.py").write_text(
        textwrap.dedent("""
        import keras

        def build_model(num_classes: int = 2):
            return keras.Sequential([keras.Input((5,)), keras.layers.Dense(num_classes)])
    """)
    )
    with pytest.raises(
        RecipeError, match=r"the model takes examples of shape \[5\] but .* gives \[4\]"
    ):
        tpukit.run(
            from_dict({**base, "model": {"name": "my_pkg.wide:build_model"}}),
            str(tmp_path / "shape"),
        )
    assert not (tmp_path / "shape").exists()
    (user_package / "my_pkg" / "three.py").write_text(
        textwrap.dedent("""
        import numpy as np
        import tensorflow as tf

        def source(split="train", input_context=None, size: int = 64):
            x = np.random.RandomState(0).randn(size, 4).astype("float32")
            y = (x.sum(1) > 0).astype("int32") + (x[:, 0] > 0.5).astype("int32")  # classes 0, 1, 2
            return tf.data.Dataset.from_tensor_slices((x, y))
    """)
    )
    three = {**base, "data": {**base["data"], "source": "my_pkg.three:source"}}
    with pytest.raises(
        RecipeError,
        match=r"has 2 classes \(ids 0..1\) but the labels seen in 128 examples range over \[0, 2\]\. "
        r"Fix: set model.num_classes to at least 3 \(e.g. --set model.num_classes=3\)",
    ):
        tpukit.run(
            from_dict({**three, "model": {"name": "my_pkg.models:build_model", "num_classes": 2}}),
            str(tmp_path / "labels"),
        )
    assert not (tmp_path / "labels").exists()
    # The printed fix works.
    fixed = from_dict({**three, "model": {"name": "my_pkg.models:build_model", "num_classes": 3}})
    assert tpukit.run(fixed, str(tmp_path / "labels"))["step"] == 2


def test_fit_without_labels_is_a_recipe_error(tmp_path):
    x, _ = _arrays()
    with pytest.raises(RecipeError, match="received no y"):
        tpukit.fit(build, x, epochs=1, batch_size=32, output_dir=str(tmp_path / "f"))


def _registries():
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    return dict(MODELS), dict(SOURCES)


def test_fit_leaves_the_registries_as_it_found_them(tmp_path):
    x, y = _arrays()
    before = _registries()
    metrics = tpukit.fit(
        build, x, y, epochs=1, batch_size=64, output_dir=str(tmp_path / "ok"), verbose=0
    )
    assert metrics["status"] == "done"
    assert _registries() == before  # no closure over x and y is left behind


def test_fit_that_raises_leaves_the_registries_as_it_found_them(tmp_path):
    x, y = _arrays()
    before = _registries()
    with pytest.raises(RecipeError, match="steps_per_execution"):  # from_dict, while registered
        tpukit.fit(
            build,
            x,
            y,
            epochs=1,
            batch_size=64,
            output_dir=str(tmp_path / "a"),
            steps_per_execution=0,
        )
    assert _registries() == before

    def broken():
        raise RuntimeError("the user's builder fails")

    with pytest.raises(RuntimeError, match="the user's builder fails"):  # inside run
        tpukit.fit(broken, x, y, epochs=1, batch_size=64, output_dir=str(tmp_path / "b"), verbose=0)
    assert _registries() == before


def test_fit_under_a_registered_name_restores_that_registration(tmp_path):
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    def mine(split="train", input_context=None):
        raise AssertionError("fit must use its own source under this name")

    tpukit.register_model("test:taken", build)
    tpukit.register_source("test:taken", mine)
    try:
        x, y = _arrays()
        tpukit.fit(
            build, x, y, epochs=1, batch_size=64, output_dir=str(tmp_path / "t"), name="test:taken"
        )
        assert MODELS["test:taken"] is build and SOURCES["test:taken"] is mine
    finally:
        del MODELS["test:taken"], SOURCES["test:taken"]


def test_fit_keeps_no_reference_to_your_arrays(tmp_path):
    import gc
    import weakref

    x, y = _arrays()
    alive = weakref.ref(x)
    tpukit.fit(build, x, y, epochs=1, batch_size=64, output_dir=str(tmp_path / "w"), verbose=0)
    del x
    gc.collect()
    assert alive() is None


def test_a_label_beyond_those_read_before_training_leaves_no_directory_and_the_fix_runs(
    tmp_path, user_package, monkeypatch
):
    from tpukit.task import compiling

    # Only the first 16 labels are read before training: the label 3 at example 100 is met by a training step.
    monkeypatch.setattr(compiling, "LABEL_SAMPLE", 16)
    (user_package / "my_pkg" / "late.py").write_text(
        textwrap.dedent("""
        import numpy as np
        import tensorflow as tf

        def source(split="train", input_context=None):
            x = np.random.RandomState(0).randn(128, 4).astype("float32")
            y = (x.sum(1) > 0).astype("int32")
            y[100] = 3
            return tf.data.Dataset.from_tensor_slices((x, y))
    """)
    )
    raw = {
        "data": {
            "source": "my_pkg.late:source",
            "global_batch_size": 32,
            "eval_split": None,
            "shuffle_buffer": 1,
        },
        "train": {"epochs": 1, "learning_rate": 0.01},
        "runtime": {"verbose": 0},
    }
    with pytest.raises(
        RecipeError,
        match=r"has label 3 .* outputs 2 classes\. Fix: set model.num_classes to at least 4",
    ):
        tpukit.run(
            from_dict({**raw, "model": {"name": "my_pkg.models:build_model"}}),
            str(tmp_path / "late"),
        )
    assert not (
        tmp_path / "late"
    ).exists()  # ckpt-0, logs/ and recipe.yaml of the failed new run are gone
    fixed = from_dict({**raw, "model": {"name": "my_pkg.models:build_model", "num_classes": 4}})
    assert tpukit.run(fixed, str(tmp_path / "late"))["step"] == 4


def test_validation_split_holds_out_the_last_examples_as_keras_does(tmp_path):
    """keras-io scripts fit with `validation_split=0.1`: the same examples as `validation_data` of the last 10%
    (taken before shuffling), so the same run; refused with dataset_fn, beside validation_data, or out of (0, 1)."""
    x, y = _arrays()
    common = dict(epochs=1, batch_size=32, steps_per_execution=1, seed=0, verbose=0)
    split = tpukit.fit(build, x, y, validation_split=0.25, output_dir=str(tmp_path / "s"), **common)
    at = int(np.ceil(len(x) * 0.75))
    given = tpukit.fit(
        build,
        x[:at],
        y[:at],
        validation_data=(x[at:], y[at:]),
        output_dir=str(tmp_path / "g"),
        **common,
    )
    assert split["steps_per_epoch"] == given["steps_per_epoch"] == at // 32
    assert split["eval_examples"] == given["eval_examples"] == len(x) - at
    assert split["eval"] == given["eval"] and split["train"] == given["train"]
    for bad, match in (
        (dict(validation_split=1.0), "between 0 and 1"),
        (dict(validation_split=0.1, validation_data=(x, y)), "cannot be combined"),
    ):
        with pytest.raises(RecipeError, match=match):
            tpukit.fit(build, x, y, output_dir=str(tmp_path / "bad"), **common, **bad)
    assert not (tmp_path / "bad").exists()


def test_validation_split_cuts_where_keras_does():
    """floor(n * (1 - fraction)) training examples (Keras 3.15's train_validation_split): 5 at 0.5 train on 2."""
    from keras.src.trainers.data_adapters import array_slicing

    from tpukit.user_model import _split_off

    for total, fraction in ((5, 0.5), (12345, 0.1), (7, 0.3), (100, 0.25)):
        x = {"a": np.arange(total), "b": np.arange(total) * 2}
        y = np.arange(total) % 3
        x_train, y_train, (x_val, y_val), _ = _split_off(x, y, fraction, None)
        (kx, ky, _), (vx, vy, _) = array_slicing.train_validation_split((x, y, None), fraction)
        assert len(y_train) == len(ky) and list(y_val) == list(vy), (total, fraction)
        assert list(x_train["b"]) == list(kx["b"]) and list(x_val["a"]) == list(vx["a"])
    with pytest.raises(RecipeError, match="leaves no training example"):
        _split_off(np.arange(1), np.arange(1), 0.5, None)


def _attention_model(with_py_function: bool):
    import keras
    import tensorflow as tf

    class HostSide(keras.layers.Layer):
        """An op XLA has no kernel for (`tf.py_function`), as a user's layer may hold."""

        def call(self, x):
            y = tf.py_function(lambda t: t * 1.0, [x], tf.float32)
            y.set_shape(x.shape)
            return y

    inputs = keras.Input((4, 8))
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    if with_py_function:
        x = HostSide()(x)
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("with_py_function", [False, True], ids=["xla", "no-xla-kernel"])
@pytest.mark.integration
def test_fit_compiles_an_attention_model_with_xla_or_trains_it_without(
    tmp_path, with_py_function, caplog, monkeypatch
):
    from tpukit.planner import hardware

    # 4 steps earn no compile back: a compile that costs nothing stands for a run long enough to
    monkeypatch.setattr(hardware, "XLA_CPU_COMPILE_SECONDS", 0.0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4, 8)).astype("float32"), rng.integers(0, 2, 64).astype("int32")

    def fit(py_function: bool, name: str, **settings):
        return tpukit.fit(
            lambda: _attention_model(py_function),
            x,
            y,
            epochs=1,
            batch_size=16,
            output_dir=str(tmp_path / name),
            verbose=0,
            **settings,
        )

    metrics = fit(with_py_function, "run", validation_data=(x[:32], y[:32]))
    assert metrics["step"] == 4
    if not with_py_function:
        assert (
            metrics["jit_compile"] is True and "MultiHeadAttention" in metrics["jit_compile_reason"]
        )
        return
    # XLA was tpukit's own choice: a step it cannot compile trains as before, and every record says so
    assert metrics["jit_compile"] is False
    assert "XLA could not compile this model's step" in metrics["jit_compile_reason"]
    assert "EagerPyFunc" in metrics["jit_compile_reason"]
    assert "training without XLA" in caplog.text
    import zipfile

    with zipfile.ZipFile(tmp_path / "run" / "model.keras") as saved:
        assert json.loads(saved.read("config.json"))["compile_config"]["jit_compile"] is False
    # run again over the finished run: nothing trains, and the evaluation falls back the same way
    again = fit(True, "run", validation_data=(x[:32], y[:32]))
    assert again["step"] == 4 and again["jit_compile"] is False and "accuracy" in again["eval"]
    # asked for by the user, XLA is not second-guessed: the error is raised
    with pytest.raises(Exception, match="EagerPyFunc|unsupported operations"):
        fit(True, "forced", jit_compile=True)


def test_fit_refuses_a_built_model_in_place_of_its_builder_and_says_how(tmp_path):
    x, y = _arrays()
    for given, what in ((build(), "Sequential instance"), ("build", "str value")):
        with pytest.raises(RecipeError) as info:
            tpukit.fit(given, x, y, epochs=1, batch_size=64, output_dir=str(tmp_path))
        message = str(info.value)
        assert "model_fn must be a function that builds and returns a new keras.Model" in message
        assert f"received a {what}" in message and "init_weights='trained.keras'" in message
    assert not (tmp_path / "metrics.json").exists()  # refused before anything was written
