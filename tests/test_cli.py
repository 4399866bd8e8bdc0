"""The `tpukit` command (tpukit/cli.py), run as a user runs it: the installed `tpukit` script and `python -m tpukit`
in subprocesses where the proof needs a fresh process (what the terminal shows first, a quiet start, nothing
written), `tpukit.cli.main` in this process where a subprocess would only add TensorFlow's start-up (the manual
pages, bad input). About 25 s: four subprocesses import TensorFlow, one trains digits_cnn for one epoch."""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import yaml
from helpers import RECIPES, REPO, digits_recipe

from tpukit import cli
from tpukit.recipe import load_recipe, packaged_recipes

# What `pip install` put beside this venv's python (setup.cfg's console_scripts).
SCRIPT = os.path.join(os.path.dirname(sys.executable), "tpukit")
# A line TensorFlow's or XLA's C++ code logs (absl's format and TensorFlow's older one), or absl's notice.
CPP_LOG_LINE = re.compile(
    r"^([IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \S+:\d+\]|\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+:\d+\])|absl::InitializeLog"
)


def run(*args: str, cwd: str = REPO, **env: str) -> subprocess.CompletedProcess:
    """`args` as a user types them, in a shell that has not set TPUKIT_VERBOSE or TF_CPP_MIN_LOG_LEVEL (the test
    process sets the latter) unless `env` does."""
    base = {
        k: v for k, v in os.environ.items() if k not in ("TPUKIT_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")
    }
    base.pop("KERAS_BACKEND", None)
    return subprocess.run(
        args, capture_output=True, text=True, cwd=cwd, env={**base, **env}, timeout=300
    )


def tpukit(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "tpukit", *args, **kwargs)


def cpp_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if CPP_LOG_LINE.search(line)]


def tree(*roots) -> dict[str, float]:
    """Every file and directory under `roots`, with its modification time."""
    found = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                path = os.path.join(folder, name)
                found[path] = os.lstat(path).st_mtime
    return found


# ---- what a user sees first --------------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_installed_script_trains_and_tpukits_line_comes_first_with_no_cpp_start_up_line(
    tmp_path,
):
    assert os.path.exists(SCRIPT), (
        "the console script is missing: pip install -e . (setup.cfg entry_points)"
    )
    result = run(
        SCRIPT, "train", "digits_cnn", "--set", "train.epochs=1", "--set", "data.global_batch_size=32",
        "--output_dir", str(tmp_path / "run"), cwd=str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        "tpukit: engine tensorflow, 1 replica on 1 CPU (/device:CPU:0), default strategy "
        "(_DefaultDistributionStrategy) because "
    )
    assert "TensorFlow" in first and "Keras" in first  # what it found, and with what
    assert cpp_lines(result.stderr) == []
    assert "tpukit: done (done, step 44)" in result.stdout
    assert os.path.exists(tmp_path / "run" / "metrics.json")


@pytest.mark.integration
def test_the_doctor_starts_quietly_and_still_reports(tmp_path):
    result = tpukit("doctor", "--json", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["accelerator"]["replicas"] == 1
    assert cpp_lines(result.stderr) == [] and result.stderr == ""


@pytest.mark.integration
def test_a_users_tf_cpp_min_log_level_0_shows_every_cpp_line(tmp_path):
    # The old spelling too: `python -m tpukit.check` keeps working, and the user's choice wins over the quiet start.
    result = run(
        sys.executable, "-m", "tpukit.check", "digits_cnn", "--rule", "batch", cwd=str(tmp_path),
        TF_CPP_MIN_LOG_LEVEL="0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[WARN] batch: global batch 64 = 8 cores x 8 per core" in result.stdout
    # TensorFlow's INFO start-up lines, which the quiet start hides (which ones depends on the CPU: "oneDNN custom
    # operations are on" only where TensorFlow turns them on, e.g. not on an AMD EPYC without AVX-512)
    assert any(line.startswith("I0000") for line in cpp_lines(result.stderr))
    assert any("absl::InitializeLog" in line for line in result.stderr.splitlines())


# ---- show ----------------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_show_prints_the_resolved_recipe_and_the_plan_on_the_jax_engine_and_writes_nothing(
    tmp_path,
):
    home, cache, work = tmp_path / "home", tmp_path / "cache", tmp_path / "work"
    for folder in (home / ".keras", cache, work):
        folder.mkdir(parents=True)
    # Keras writes its config file at its first import in a new home; that is Keras', present in any real home.
    (home / ".keras" / "keras.json").write_text('{"backend": "tensorflow"}')
    before = tree(home, cache, work, RECIPES)
    result = tpukit(
        "show", "digits_cnn", "--set", "data.global_batch_size=32", "--set", "runtime.engine=jax",
        cwd=str(work), HOME=str(home), XDG_CACHE_HOME=str(cache), MPLCONFIGDIR=str(tmp_path / "mpl"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # Nothing written: no run directory, no compilation cache, no data, no change to the recipes.
    assert tree(home, cache, work, RECIPES) == before
    assert result.stdout.startswith(f"# Resolved from {os.path.join(RECIPES, 'digits_cnn.yaml')}")
    assert "\n  global_batch_size: 32\n" in result.stdout and "\n  engine: jax\n" in result.stdout
    assert "tpukit plan: global batch 32 = 1 replica(s) x 32 per replica" in result.stdout
    assert "tpukit plan: 44 steps per epoch over 1437 examples" in result.stdout
    assert "tpukit plan: output runs/digits_cnn" in result.stdout
    assert result.stdout.rstrip().endswith(
        "nothing was written. To train: tpukit train digits_cnn --set data.global_batch_size=32 "
        "--set runtime.engine=jax"
    )
    assert cpp_lines(result.stderr) == []


@pytest.mark.integration
def test_show_on_a_tpu_without_tensorflow_tpu_plans_on_the_jax_engine_and_says_why(tmp_path):
    """`runtime.engine: auto` (the recipe does not set it) on a faked Kaggle TPU runtime (ISTPUVM=1; JAX kept on
    the CPU): the engine is chosen before Keras loads, and the plan's first line says which and why."""
    result = tpukit(
        "show", "digits_cnn", cwd=str(tmp_path), ISTPUVM="1", JAX_PLATFORMS="cpu", TPUKIT_JAX_COMPILATION_CACHE="0",
        MPLCONFIGDIR=str(tmp_path / "mpl"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\n  engine: auto\n" in result.stdout  # the recipe, as written
    assert (
        "mode train_and_eval, engine jax (auto: a TPU is attached and no TensorFlow TPU build is installed)\n"
        in result.stdout
    )
    assert "tpukit: engine jax, 1 replica on 1 CPU device" in result.stderr
    assert set(os.listdir(tmp_path)) <= {"mpl"}  # nothing written (matplotlib's cache aside)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TPUKIT_JAX_COMPILATION_CACHE", "0")
    return tmp_path


def test_show_cifar10_resnet_with_a_global_batch_of_256_plans_on_the_data_it_finds(in_tmp, capsys):
    with tfds.testing.mock_data(
        num_examples=1024
    ):  # the data, were it downloaded: 1,024 examples per split
        status = cli.main(["show", "cifar10_resnet", "--set", "data.global_batch_size=256"])
    out = capsys.readouterr().out
    assert status == 0
    assert "\n  global_batch_size: 256\n" in out and "\n  depth: 56\n" in out
    assert "tpukit plan: global batch 256 = 1 replica(s) x 256 per replica" in out
    assert "tpukit plan: 4 steps per epoch over 1024 examples, 640 steps in all" in out
    assert os.listdir(in_tmp) == []


def test_show_plans_with_the_published_split_sizes_when_the_data_is_not_here_and_leaves_tmpdir_as_it_was(
    in_tmp, capsys, monkeypatch, tmp_path_factory
):
    """Offline and not downloaded (this machine, CI): the plan counts the TFDS catalogue's split sizes, says so,
    prints the connection line once, downloads nothing and writes nothing, not even the empty `tmp*tfds`
    directories TFDS makes for the info of a dataset that is not prepared."""
    temporary = tmp_path_factory.mktemp("TMPDIR")
    (temporary / "someone_elses").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # what TMPDIR sets
    data_dir = in_tmp / "tensorflow_datasets"
    status = cli.main(
        [
            "show",
            "cifar10_resnet",
            f"--set=data.data_dir={data_dir}",
            "--set",
            "data.global_batch_size=256",
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "\n  name: cifar10\n" in captured.out and "\n  global_batch_size: 256\n" in captured.out
    assert (
        "tpukit show: 'cifar10' is not downloaded here, so this plan counts the split sizes the TFDS catalogue "
        "publishes (train 50,000, test 10,000)" in captured.out
    )
    assert "tpukit plan: 195 steps per epoch over 50000 examples" in captured.out
    assert "40 eval steps over 10000 examples" in captured.out
    assert captured.err.count("tpukit: engine tensorflow, ") == 1, captured.err
    assert "TensorInfo.dtype" not in captured.err and "Traceback" not in captured.err
    assert not data_dir.exists() and os.listdir(in_tmp) == []
    assert os.listdir(temporary) == ["someone_elses"] and tempfile.tempdir == str(temporary)


def test_show_plans_movielens_with_its_published_rating_count_and_downloads_nothing(
    in_tmp, capsys, monkeypatch
):
    """The `movielens` source has a `download` switch that show turns off: TFDS is never asked to download (a
    download attempt is recorded and fails here), and the plan counts the published 100,000 ratings split by
    test_fraction, saying so."""
    attempts = []

    def no_download(builder, *args, **kwargs):
        attempts.append(builder.name)
        raise RuntimeError("tpukit show tried to download")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
    data_dir = in_tmp / "tensorflow_datasets"
    status = cli.main(["show", "movielens_100k_dcn", f"--set=data.data_dir={data_dir}"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert attempts == []
    assert "\n  variant: 100k-ratings\n" in captured.out
    assert (
        "tpukit show: 'movielens/100k-ratings' is not downloaded here, so this plan counts the split sizes the "
        "TFDS catalogue publishes (train ~80,000, test ~20,000: test_fraction of its 100,000 ratings; the exact "
        "split, by a hash of user and movie, needs the data)" in captured.out
    )
    assert "tpukit plan: 78 steps per epoch over 80000 examples" in captured.out
    assert "20 eval steps over 20000 examples" in captured.out
    assert (
        "nothing was written. To train: tpukit train movielens_100k_dcn --set=data.data_dir="
        in captured.out
    )
    assert "Traceback" not in captured.err
    assert not data_dir.exists() and os.listdir(in_tmp) == []


def test_show_prints_a_recipe_with_a_placeholder_and_names_the_key_the_value_and_the_fix(
    in_tmp, capsys
):
    assert cli.main(["show", "imagenet_resnet50"]) == 2
    captured = capsys.readouterr()
    assert (
        "\n  file_pattern: gs://YOUR_BUCKET/imagenet/{split}-*\n" in captured.out
    )  # the recipe, shown
    assert captured.err.splitlines()[-1].endswith(
        "imagenet_resnet50.yaml: data.file_pattern='gs://YOUR_BUCKET/imagenet/{split}-*' is the recipe's "
        "placeholder (YOUR_BUCKET), not your data. Fix: add --set "
        "'data.file_pattern=gs://your-bucket/imagenet/{split}-*' with your own bucket."
    )
    assert captured.err.startswith("tpukit: error: ") and "Traceback" not in captured.err


def test_show_reports_data_it_cannot_read_with_the_key_and_the_fix(in_tmp, capsys, monkeypatch):
    glob = tf.io.gfile.glob

    def denied(pattern):
        if pattern.startswith("gs://my-bucket/"):
            raise tf.errors.PermissionDeniedError(None, None, f"403 when reading {pattern}")
        return glob(pattern)

    monkeypatch.setattr(tf.io.gfile, "glob", denied)
    pattern = "gs://my-bucket/imagenet/{split}-*"
    assert cli.main(["show", "imagenet_resnet50", "--set", f"data.file_pattern={pattern}"]) == 1
    err = capsys.readouterr().err
    assert "tpukit: error: PermissionDeniedError: 403 when reading gs://my-bucket/imagenet/" in err
    assert (
        f"tpukit: the plan could not read a path it needs (the data: data.file_pattern={pattern!r}; the run "
        "directory 'runs/imagenet_resnet50'). Fix: check that the path in the error exists" in err
    )
    assert "Traceback" not in err


def test_show_downloads_nothing_and_says_so_for_data_without_published_sizes(in_tmp, capsys):
    data_dir = in_tmp / "tensorflow_datasets"
    status = cli.main(["show", "tiny_shakespeare_char_lm", f"--set=data.data_dir={data_dir}"])
    captured = capsys.readouterr()
    assert status == 1
    assert (
        "\n  name: tiny_shakespeare\n" in captured.out
    )  # the resolved recipe is shown all the same
    assert (
        "the plan needs the example counts of 'tiny_shakespeare', which is not downloaded here"
        in captured.err
    )
    assert "`tpukit show` downloads nothing" in captured.err and "Traceback" not in captured.err
    assert not data_dir.exists() and os.listdir(in_tmp) == []


NAMED_CODE = """
import pathlib
pathlib.Path("MARKER").write_text("imported")  # import-time code


def build(num_classes: int = 10, input_shape: tuple[int, ...] = (8, 8, 1)):
    pathlib.Path("BUILT").write_text("called")


def source(split="train", input_context=None, size: int = 4):
    pathlib.Path("READ").write_text("called")
"""


def _recipe_naming_code(directory, data="digits"):
    (directory / "show_named_code.py").write_text(NAMED_CODE)
    recipe = digits_recipe()
    recipe["model"] = {"name": "show_named_code:build", "input_shape": [8, 8, 1]}
    recipe["data"]["source"] = data
    (directory / "r.yaml").write_text(yaml.safe_dump(recipe))
    return str(directory / "r.yaml")


@pytest.mark.parametrize("data", ["digits", "show_named_code:source"])
def test_show_imports_and_runs_no_code_the_recipe_names(in_tmp, capsys, monkeypatch, data):
    monkeypatch.syspath_prepend(
        str(in_tmp)
    )  # as `python -m tpukit` from this directory: importable
    monkeypatch.delitem(sys.modules, "show_named_code", raising=False)
    recipe = _recipe_naming_code(in_tmp, data)
    status = cli.main(["show", recipe, "--set", "data.size=8"] if ":" in data else ["show", recipe])
    out = capsys.readouterr().out
    assert status == 0
    assert sorted(os.listdir(in_tmp)) == ["r.yaml", "show_named_code.py"]  # no MARKER, BUILT, READ
    assert "show_named_code" not in sys.modules
    assert "name: show_named_code:build" in out and "- 8" in out  # shown as written
    assert (
        "tpukit show: model.name='show_named_code:build' is code the recipe names; show does not import it"
        in out
    )
    if ":" in data:  # the plan counts the source's examples: not made, and show says why
        assert "tpukit show: data.source='show_named_code:source' is code the recipe names" in out
        assert (
            "tpukit show: no plan: making it would call data.source='show_named_code:source', code (module "
            "'show_named_code') that `tpukit show` does not import or run" in out
        )
    else:
        assert "tpukit plan: global batch" in out
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    assert "show_named_code:build" not in MODELS and "show_named_code:source" not in SOURCES


def test_show_says_a_loss_and_metrics_named_as_code_are_not_imported(in_tmp, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(in_tmp))
    monkeypatch.delitem(sys.modules, "show_named_code", raising=False)
    recipe = _recipe_naming_code(in_tmp)
    overrides = [
        "train.loss=show_named_code:loss",
        "train.metrics=[accuracy, show_named_code:metric]",
    ]
    status = cli.main(["show", recipe, *[a for o in overrides for a in ("--set", o)]])
    out = capsys.readouterr().out
    assert status == 0
    assert sorted(os.listdir(in_tmp)) == [
        "r.yaml",
        "show_named_code.py",
    ]  # no MARKER: nothing imported
    assert "show_named_code" not in sys.modules
    assert (
        "tpukit show: train.loss='show_named_code:loss' is code the recipe names; show does not import it (its "
        "module's code would run). `tpukit check` and `tpukit train` import it." in out
    )
    assert "tpukit show: train.metrics='show_named_code:metric' is code the recipe names" in out
    assert (
        "'accuracy'" not in out.split("train.metrics=")[-1].split("\n")[0]
    )  # a Keras name is not code


def test_loading_a_recipe_as_check_and_train_do_runs_the_module_it_names(in_tmp, monkeypatch):
    """The control for the test above: the module's import-time code does run when the recipe is loaded."""
    monkeypatch.syspath_prepend(str(in_tmp))
    monkeypatch.delitem(sys.modules, "show_named_code", raising=False)
    load_recipe(_recipe_naming_code(in_tmp))
    assert (in_tmp / "MARKER").read_text() == "imported"
    sys.modules.pop("show_named_code", None)


# ---- recipes -------------------------------------------------------------------------------------------------------


def test_recipes_lists_every_shipped_recipe_from_its_own_file():
    result = tpukit("recipes", "--json")  # no TensorFlow: a fraction of a second
    assert result.returncode == 0, result.stderr
    entries = {e["name"]: e for e in json.loads(result.stdout)}
    assert sorted(entries) == sorted(packaged_recipes())
    digits = entries["digits_cnn"]
    assert digits["trains"] == "a small convnet on scikit-learn's bundled 8x8 handwritten digits."
    assert digits["data"] == "digits" and digits["command"] == "tpukit train digits_cnn"
    assert digits["smoke_test"] == "tpukit train digits_cnn --set train.epochs=1"
    assert (
        digits["measured"].startswith("on a 2-core x86 CPU only")
        and "98.6-99.4%" in digits["measured"]
    )
    assert entries["cifar10_resnet"]["data"] == "tfds cifar10"
    imagenet = entries["imagenet_resnet50"]
    assert imagenet["command"].startswith(
        "tpukit train imagenet_resnet50 --tpu=my-tpu --set data.file_pattern="
    )
    # The quick try keeps what the command needs (the TPU, your bucket): it runs as the header documents it.
    assert imagenet["smoke_test"] == (
        f"{imagenet['command']} --set train.epochs=1 --set train.steps_per_epoch=2 --set data.global_batch_size=8"
    )
    for entry in entries.values():
        assert entry["trains"] and entry["data"] and entry["command"].startswith("tpukit train ")


def test_recipes_as_text_names_each_recipe_with_its_command(capsys):
    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(packaged_recipes())} recipes ship with tpukit.")
    for name in packaged_recipes():
        assert f"\n{name}\n" in out and f"    run       tpukit train {name}" in out


def test_the_documentation_lists_every_shipped_recipe():
    with open(os.path.join(REPO, "docs", "recipes.md"), encoding="utf-8") as f:
        page = f.read()
    assert [n for n in packaged_recipes() if f"`{n}`" not in page] == []


# ---- manual pages --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, option",
    [
        (None, "--verbose"),
        ("train", "--accept_changes=KEY"),
        ("show", "--output_dir"),
        ("recipes", "--json"),
        ("check", "--tpu-type"),
        ("doctor", "--json"),
        ("smoke", "--mesh_model"),
    ],
)
def test_help_at_every_level_is_a_manual_page_with_the_commands_own_options(
    command, option, capsys
):
    args = ["--help"] if command is None else [command, "--help"]
    assert cli.main(args) == 0
    page = capsys.readouterr().out
    sections = ["NAME", "SYNOPSIS", "OPTIONS", "EXIT STATUS", "EXAMPLES"]
    sections += ["COMMANDS"] if command is None else ["DESCRIPTION"]
    assert all(f"\n{s}\n" in f"\n{page}" for s in sections), page
    assert option in page
    # argparse's own layout is not left in a page: its headings, its -h line, `--tpu TPU` for `--tpu=TPU`.
    for argparse_text in ("positional arguments:", "options:", "show this help message and exit"):
        assert argparse_text not in page
    assert not re.search(r"^ +--\w+ [A-Z_]+\b", page, re.MULTILINE), page
    if command is not None:
        assert page.startswith(f"NAME\n    tpukit {command} - ")
        assert cli.main(["help", command]) == 0 and capsys.readouterr().out == page


def test_train_manual_says_a_failed_export_exits_1():
    """tpukit.train returns 1 on `ExportFailedError`: the manual's exit statuses say so."""
    status = " ".join(cli.manual("train").split("EXIT STATUS")[1].split("EXAMPLES")[0].split())
    assert "1 the environment" in status and "an output could not be exported" in status
    assert "exports without training" in status


def test_python_m_tpukit_train_help_is_the_train_manual_page_and_exits_0():
    result = run(
        sys.executable, "-m", "tpukit.train", "--help"
    )  # absl's own: a dump of its flags, exit 1
    assert result.returncode == 0, result.stderr
    assert result.stdout == cli.manual("train") + "\n"
    assert result.stdout.startswith("NAME\n    tpukit train - ") and result.stderr == ""


def test_the_script_and_python_m_tpukit_print_the_same_manual():
    by_script, by_module = run(SCRIPT, "smoke", "--help"), tpukit("smoke", "--help")
    assert by_script.returncode == by_module.returncode == 0
    assert by_script.stdout == by_module.stdout and "tpukit smoke - " in by_script.stdout


def test_version_and_verbose(capsys, monkeypatch):
    # setenv records the variable's state before the test, so the "1" the CLI sets is undone after it (a later
    # test's subprocesses would otherwise start verbose).
    monkeypatch.setenv("TPUKIT_VERBOSE", "")
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out == "tpukit 0.1.0\n"
    assert cli.main(["--verbose", "recipes", "--json"]) == 0
    assert os.environ["TPUKIT_VERBOSE"] == "1"
    monkeypatch.setenv("TPUKIT_VERBOSE", "")
    assert cli.main(["recipes", "--json", "--verbose"]) == 0  # after the command too
    assert os.environ["TPUKIT_VERBOSE"] == "1"


# ---- bad input -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        (["trian", "digits_cnn"], "unknown command 'trian' (did you mean 'train'?)"),
        (["--bogus", "train"], "unknown option '--bogus' before the command"),
        ([], "no command given"),
        (["show", "nope"], "recipe 'nope' not found"),
        (
            ["show", "digits_cnn", "--set", "trainepochs"],
            "--set 'trainepochs': expected section.key=value",
        ),
        (["show", "digits_cnn", "--set", "train.epoch=3"], "unknown key train.epoch (received 3)"),
        (["check", "nope"], "recipe 'nope' not found"),
        # argparse's usage errors, which name no fix of their own
        (
            ["show"],
            "tpukit show: the following arguments are required: recipe. Fix: see `tpukit show --help`",
        ),
        (
            ["show", "digits_cnn", "--mode", "bogus"],
            "argument --mode: invalid choice: 'bogus' (choose from 'train_and_eval', 'train', 'eval')",
        ),
        (["recipes", "--bogus"], "tpukit recipes: unrecognized arguments: --bogus"),
        (
            ["check", "digits_cnn", "--cores", "x"],
            "tpukit check: argument --cores: invalid int value: 'x'. Fix: see `tpukit check --help`",
        ),
    ],
)
def test_bad_input_is_one_message_with_the_value_and_the_fix_and_exit_2(args, expected, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    message = err.strip().splitlines()[-1]
    assert message.startswith("tpukit: error: ") and expected in message and "Fix:" in message
    assert "Traceback" not in err and "usage:" not in err
    assert (
        argparse.ArgumentParser.error.__module__ == "argparse"
    )  # the tools' parsers are theirs again


def test_train_refuses_an_unknown_recipe_before_tensorflow_loads():
    # A subprocess: train's flags are absl's, parsed once per process. Fast: it stops before TensorFlow.
    result = run(SCRIPT, "train", "nope", "--set", "train.epochs=1")
    assert result.returncode == 2
    assert (
        result.stderr.startswith("tpukit: error: recipe 'nope' not found")
        and "Fix:" in result.stderr
    )
    assert "Traceback" not in result.stderr
    flag = run(SCRIPT, "train", "digits_cnn", "--epochs=3")
    assert flag.returncode == 2 and "Fix: see `tpukit train --help`" in flag.stderr
    missing = run(SCRIPT, "train")
    assert missing.returncode == 2 and missing.stderr.splitlines() == [
        "tpukit: error: one RECIPE expected, none given. Fix: `tpukit train RECIPE [--set section.key=value ...] "
        "[--output_dir DIR]` with one recipe file or shipped recipe, e.g. `tpukit train digits_cnn`; see "
        "`tpukit train --help`."
    ]


def test_ctrl_c_outside_training_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C in `tpukit doctor`, `show` or `check` (a KeyboardInterrupt anywhere in them): no traceback."""

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    with pytest.raises(SystemExit) as exit_:
        cli.entry_point()
    assert exit_.value.code == 130
    assert capsys.readouterr().err == "tpukit: interrupted\n"
