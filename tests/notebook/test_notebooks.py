"""The notebooks, as stored and as run: nbformat-valid without outputs, a Colab badge and a time line, the install
cell identical to tpukit/notebook/colab.py, library calls only; and each one executed top to bottom, as stored, on
this CPU with nbclient in a fresh kernel of this venv, checking its artefacts (PNG plots, the throughput/MFU line,
sampled text).

Nothing is injected: tpukit is installed in this venv, so the install cell installs nothing (it says so; the pip
plan it runs elsewhere is tests/notebook/test_colab.py's), `OUTPUT_ROOT = ""` writes to `runs/` under the kernel's
working folder (a temp folder) and `SMALL = None` picks the small settings because there is no TPU or GPU here.
TFDS cannot download here, so the notebooks fall back to their offline recipes (digits_cnn, textfiles_char_lm)
through `tpukit.notebook.first_available`. One cell is appended after the last, to see the TensorBoard server that
`%tensorboard` started before the kernel shuts down.
"""

import ast
import glob
import importlib.metadata
import json
import os
import re
import signal
import sys
import time

import nbformat  # the test extra must carry nbformat, nbclient, ipykernel and matplotlib (no skip hides it)
import pytest
from helpers import REPO

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))
NAMES = [os.path.basename(p) for p in NOTEBOOKS]
# Code a notebook may define: the user's own model and data are the point of your_keras_model.
ALLOWED_DEFINITIONS = {"your_keras_model.ipynb": {"build_model", "dataset_fn"}}


def read(name: str):
    return nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)


def install_cell_index(notebook) -> int:
    from tpukit.notebook import colab

    matches = [
        i for i, c in enumerate(notebook.cells) if c.source == colab.cell_source().rstrip("\n")
    ]
    matches += [i for i, c in enumerate(notebook.cells) if c.source == colab.cell_source()]
    assert len(matches) == 1, (
        "the install cell must equal tpukit/notebook/colab.py's install block (print it with `python -m tpukit.notebook.colab`)"
    )
    return matches[0]


def test_the_notebooks_exist():
    assert NAMES == [
        "language_model.ipynb",
        "llm_lora.ipynb",
        "quickstart.ipynb",
        "your_keras_model.ipynb",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_stored_valid_without_outputs_with_badge_and_time_line(name):
    notebook = read(name)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{name}: stored with outputs"
            )
    first = notebook.cells[0]
    assert first.cell_type == "markdown"
    stem = name.removesuffix(".ipynb")
    assert (
        f"https://colab.research.google.com/github/tpukit/tpukit/blob/main/notebooks/{stem}.ipynb"
        in first.source
    )
    assert "on a TPU: not measured yet" in first.source
    assert "on a CPU:" in first.source and "measured" in first.source.split("on a CPU:")[1]
    assert "{" + stem + "}" not in first.source  # the time placeholder was filled in


@pytest.mark.parametrize("name", NAMES)
def test_install_cell_is_tpukit_colab_verbatim_and_first_after_the_settings(name):
    notebook = read(name)
    index = install_cell_index(notebook)
    code = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code"]
    assert code[0] < index == code[1], (
        "settings cell first, then the install cell, before any import of tpukit"
    )
    assert "parameters" in notebook.cells[code[0]].metadata.get("tags", [])
    for variable in ("SMALL", "OUTPUT_ROOT", "TPUKIT_SOURCE", "INSTALL_DRY_RUN"):
        assert f"\n{variable} = " in "\n" + notebook.cells[code[0]].source


ENGINE_LINE = "ENGINE = tpukit.notebook.start(tpukit.notebook.choose_engine())"


@pytest.mark.parametrize("name", NAMES)
def test_the_engine_is_chosen_right_after_the_install_cell_and_passed_on(name):
    """Keras fixes its backend at its first import: the cell after the install cell decides the engine, no cell
    before it imports Keras or TensorFlow, and the training calls pass `ENGINE` (as `runtime.engine`)."""
    notebook = read(name)
    code = [c.source for c in notebook.cells if c.cell_type == "code"]
    assert ENGINE_LINE in code[2]
    for source in code[:2] + [code[2].split(ENGINE_LINE)[0]]:
        assert "import keras" not in source and "import tensorflow" not in source
    later = "\n".join(code[3:])
    assert "import tensorflow" not in code[2] and "import keras" not in code[2]
    assert "tpukit.notebook.connect(ENGINE)" in later
    assert later.count("engine=ENGINE") + later.count("strategy, ENGINE)") >= 2, later
    assert "tpukit.connect()" not in later and "strategy.scope()" not in later


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_call_library_code_only(name):
    """No loops, classes or helper functions in the cells (the install cell is tpukit/notebook/colab.py's code)."""
    notebook = read(name)
    skip = install_cell_index(notebook)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or index == skip:
            continue
        python = "\n".join(
            line for line in cell.source.splitlines() if not line.lstrip().startswith("%")
        )
        for node in ast.walk(ast.parse(python)):
            assert not isinstance(node, (ast.For, ast.While, ast.ClassDef, ast.Lambda)) or (
                isinstance(node, ast.Lambda) and name in ALLOWED_DEFINITIONS
            ), f"{name} cell {index}: notebook logic ({type(node).__name__}); move it into tpukit"
            if isinstance(node, ast.FunctionDef):
                assert node.name in ALLOWED_DEFINITIONS.get(name, set()), (
                    f"{name}: defines {node.name}()"
                )


# A line of TensorFlow's or XLA's C++ logging (tpukit/environment/quiet.py lists those of the start).
CPP_LOG_LINE = re.compile(
    r"^([IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \S+:\d+\]|\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+:\d+\])"
    r"|absl::InitializeLog"
)


@pytest.mark.integration
def test_a_fresh_kernel_starts_the_engine_quietly(tmp_path):
    """The notebooks' engine cell, verbatim, in a fresh kernel with the user's environment (no
    TF_CPP_MIN_LOG_LEVEL): its output is its own line, and no C++ start-up line. A second cell writes to fd 2 as
    native code does, so the test would see those lines had they been written."""
    from nbclient import NotebookClient

    cell = [c.source for c in read("quickstart.ipynb").cells if c.cell_type == "code"][2]
    assert ENGINE_LINE in cell
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(cell),
            nbformat.v4.new_code_cell(
                "import os\n_ = os.write(2, b'fd 2 reaches the notebook\\n')"
            ),
        ]
    )
    # ipykernel shows fd 2 in the notebook except under pytest (PYTEST_CURRENT_TEST): a user's kernel does.
    unset = (
        "TF_CPP_MIN_LOG_LEVEL",
        "TPUKIT_VERBOSE",
        "KERAS_BACKEND",
        "TF_CONFIG",
        "PYTEST_CURRENT_TEST",
    )
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)
    engine_cell, fd_cell = (
        outputs_of(nbformat.v4.new_notebook(cells=[c]))[0] for c in notebook.cells
    )
    # The kernel shows what native code writes to fd 2.
    assert fd_cell == "fd 2 reaches the notebook\n"
    assert [line for line in engine_cell.splitlines() if CPP_LOG_LINE.search(line)] == []
    assert engine_cell == "engine: tensorflow\n", engine_cell


def _tensorboard_pids() -> set[int]:
    from tensorboard import manager

    return {info.pid for info in manager.get_all()}


def _kill_tensorboards(pids) -> None:
    """Stops the TensorBoard servers `%tensorboard` started (by their pid) in case the kernel's shutdown did not."""
    from tensorboard import manager

    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        manager.remove_info_file(pid)


def execute(name: str, tmp_path) -> tuple[object, float]:
    """Runs the notebook as stored, in `tmp_path`; returns the executed notebook and the wall time."""
    from nbclient import NotebookClient

    notebook = read(name)
    # Evidence read while the kernel lives (its shutdown stops the TensorBoard it started): the running servers.
    notebook.cells.append(
        nbformat.v4.new_code_cell(
            "from tensorboard import manager as _manager\n"
            "print('running TensorBoards:', sorted(info.logdir for info in _manager.get_all()))"
        )
    )
    bin_dir = os.path.dirname(sys.executable)
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="2", PATH=bin_dir + os.pathsep + os.environ.get("PATH", "")
    )
    env.pop("MPLBACKEND", None)  # the kernel's inline backend turns figures into PNG outputs
    env.pop("TF_CONFIG", None)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working folder
    )
    before = _tensorboard_pids()
    start = time.perf_counter()
    try:
        client.execute(
            env=env
        )  # raises CellExecutionError (the cell and its traceback) on any error
    finally:
        _kill_tensorboards(_tensorboard_pids() - before)
    return notebook, time.perf_counter() - start


def installed_nothing(text: str) -> bool:
    """The install cell's one line for a venv where tpukit is installed, and no pip run (other cells, such as the
    doctor's fixes, may mention `pip install`)."""
    line = f"tpukit install: tpukit {importlib.metadata.version('tpukit')} is already installed with what this CPU "
    install_lines = [x for x in text.splitlines() if x.startswith("tpukit install:")]
    return (
        line in text
        and len(install_lines) == 1
        and "installing nothing" in install_lines[0]
        and "pip install" not in install_lines[0]
    )


def outputs_of(notebook) -> tuple[str, int]:
    """All text the cells showed (streams and text results) and the number of PNG images."""
    texts, pngs = [], 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                texts.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                data = output.get("data", {})
                pngs += "image/png" in data
                texts.append(data.get("text/plain", "") + data.get("text/html", ""))
    return "\n".join(texts), pngs


def _report_time(name: str, seconds: float) -> None:
    print(f"{name}: executed in {seconds:.0f} s")


@pytest.mark.slow  # ~36 s here; the three notebooks ~2 min
def test_quickstart_runs_top_to_bottom(tmp_path):
    notebook, seconds = execute("quickstart.ipynb", tmp_path)
    _report_time("quickstart", seconds)
    text, pngs = outputs_of(notebook)
    assert installed_nothing(text), text[:2000]
    assert "tpukit doctor:" in text and "OK: this environment can train." in text
    assert "SMALL = True (no TPU or GPU found" in text
    assert (
        "mnist_cnn cannot read its data here" in text
        and "recipe: digits_cnn train.epochs=3 runtime.engine=tensorflow" in text
    )
    assert pngs >= 2, "learning curves and predictions as PNG"
    assert "throughput:" in text and "examples/s" in text and "MFU" in text
    assert '<iframe id="tensorboard-frame' in text
    logdir = os.path.join(
        "runs", "digits_cnn", "logs"
    )  # OUTPUT_ROOT = "": under the working folder
    assert f"running TensorBoards: [{logdir!r}]" in text, "a TensorBoard server on the run's logs"
    run_dir = tmp_path / "runs" / "digits_cnn"
    with open(run_dir / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["step"] == 3 * metrics["steps_per_epoch"]
    assert metrics["eval"]["accuracy"] > 0.5
    assert (run_dir / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_your_keras_model_runs_top_to_bottom(tmp_path):
    notebook, seconds = execute("your_keras_model.ipynb", tmp_path)
    _report_time("your_keras_model", seconds)
    text, pngs = outputs_of(notebook)
    assert installed_nothing(text), text[:2000]
    assert pngs >= 2, "learning curves and the tpukit model's predictions as PNG"
    assert text.count("throughput:") == 2 and "MFU" in text
    for run in ("your_model_arrays", "your_model_tf_data"):
        with open(tmp_path / "runs" / run / "metrics.json") as f:
            metrics = json.load(f)
        assert metrics["eval_examples"] == 1797 - 1440
        assert metrics["eval"]["accuracy"] > 0.5, (run, metrics["eval"])


@pytest.mark.slow
def test_language_model_runs_top_to_bottom_and_samples_text(tmp_path):
    notebook, seconds = execute("language_model.ipynb", tmp_path)
    _report_time("language_model", seconds)
    text, pngs = outputs_of(notebook)
    assert installed_nothing(text), text[:2000]
    assert "tiny_shakespeare_char_lm cannot read its data here" in text
    assert pngs >= 1, "the loss curve as PNG"
    assert "throughput:" in text
    greedy, sampled = text.split("--- greedy ---\n", 1)[1].split("--- temperature 0.8 ---\n", 1)
    # 200 generated bytes after the prompt (fewer characters only where bytes formed multi-byte UTF-8).
    for sample in (greedy.strip("\n"), sampled.strip("\n")):
        assert sample.startswith("def ") and len(sample.rstrip("\n")) >= len("def ") + 200 // 4, (
            sample
        )
    assert greedy != sampled
    with open(tmp_path / "runs" / "textfiles_char_lm" / "metrics.json") as f:
        metrics = json.load(f)
    # Better than a uniform guess over 256 bytes (ln 256 = 5.55 nats): the sampled model learned something.
    assert metrics["eval"]["loss"] < 4.0


# tpukit.notebook.llm: what llm_lora.ipynb decides before training and shows after it.


@pytest.mark.parametrize(
    "devices, model", [(1, 1), (2, 2), (4, 4), (6, 3), (8, 4), (9, 3), (16, 4), (7, 1)]
)
def test_the_lora_notebook_model_axis_is_the_largest_divisor_up_to_4(devices, model):
    from tpukit.notebook import llm

    assert llm.model_axis(devices) == model


def test_the_lora_notebook_overrides_set_the_engine_and_a_mesh_this_runtime_has():
    from tpukit.notebook import llm

    # The recipes say engine jax and model 4: a Kaggle v5e-8 keeps 4, a Colab v5e-1 gets 1, a CPU/GPU runtime
    # (the tensorflow engine) 1 whatever its device count.
    assert llm.lora_overrides("/p", False, "jax", 8) == [
        "model.preset=/p",
        "runtime.engine=jax",
        "runtime.mesh.model=4",
    ]
    assert llm.lora_overrides("gemma_2b_en", False, "jax", 1)[1:] == [
        "runtime.engine=jax",
        "runtime.mesh.model=1",
    ]
    assert llm.lora_overrides("/p", True, "tensorflow", 8) == [
        "model.preset=/p",
        "runtime.engine=tensorflow",
        "runtime.mesh.model=1",
        "train.epochs=2",
    ]
    with pytest.raises(ValueError, match="engine='auto'"):
        llm.lora_overrides("/p", False, "auto")
    assert (
        llm.tiny_family("qwen2.5_0.5b_en") == "qwen" and llm.tiny_family("gemma_2b_en") == "gemma"
    )


class _Secrets:
    def __init__(self, values):
        self.values = values

    def get(self, key):
        if key not in self.values:
            raise KeyError(key)  # as google.colab.userdata.SecretNotFoundError
        return self.values[key]


def test_the_lora_notebook_copies_colabs_kaggle_secrets_or_says_how(monkeypatch, tmp_path):
    from tpukit.notebook import llm

    monkeypatch.setenv("HOME", str(tmp_path))  # no kaggle.json
    secrets = {"KAGGLE_USERNAME": "me", "KAGGLE_KEY": "k"}
    environ = {}
    line = llm.credentials_line("gemma_2b_en", environ, _Secrets(secrets))
    assert environ == secrets and "credentials from Colab's secrets" in line
    environ = {}
    line = llm.credentials_line("gemma_2b_en", environ, _Secrets({"KAGGLE_USERNAME": "me"}))
    assert (
        environ == {} and "no Kaggle credentials found here" in line and "kagglehub.login()" in line
    )
    assert "found in the environment" in llm.credentials_line("gemma_2b_en", dict(secrets), None)
    assert "HF_TOKEN" in llm.credentials_line("hf://google/gemma-2b", {}, None)
    assert "local preset directory" in llm.credentials_line(str(tmp_path), {}, None)


def test_the_lora_notebook_shows_samples_and_names_missing_exports():
    from tpukit.notebook import llm

    metrics = {
        "samples": [
            {"prompt": "what is 3 plus 4 ?", "generation": "what is 3 plus 4 ? 7", "step": 20}
        ],
        "exported": {"keras": "/r/model.keras"},
        "outputs_skipped": {"safetensors": "KerasHub exports no safetensors for this family"},
    }
    assert llm.samples_text(metrics) == "step 20: 'what is 3 plus 4 ?' -> 'what is 3 plus 4 ? 7'"
    assert "has no 'samples'" in llm.samples_text({"step": 3}) and "step" in llm.samples_text(
        {"step": 3}
    )
    assert llm.samples_text({"samples": {"20": ["x"]}}).startswith("samples: {")
    assert llm.exported(metrics, "keras") == "/r/model.keras"
    with pytest.raises(FileNotFoundError, match="no 'preset'; it exported: keras"):
        llm.exported(metrics, "preset")
    assert llm.safetensors_text(metrics) == (
        "the run exported no 'safetensors' (KerasHub exports no safetensors for this family); it exported: keras."
    )
    assert llm.generations_text(["a", "b"], ["a 1", "b 2"], ["a 1", "b 3"], "model.keras") == (
        "'a' -> 'a 1'\n'b' -> 'b 2'\nsame text as model.keras: False"
    )


@pytest.mark.slow
def test_llm_lora_runs_top_to_bottom_and_reloads_its_exports(tmp_path):
    """Needs the keras_hub_text data source, the preset and safetensors exports and the logged samples (issue 41)."""
    notebook, seconds = execute("llm_lora.ipynb", tmp_path)
    _report_time("llm_lora", seconds)
    text, pngs = outputs_of(notebook)
    assert installed_nothing(text), text[:2000]
    tiny = tmp_path / "tiny_presets" / "gemma"
    assert f"preset: a tiny gemma preset made in {tiny}" in text
    assert (
        f"recipe: gemma_lora model.preset={tiny} runtime.engine=tensorflow runtime.mesh.model=1 train.epochs=2"
        in text
    )
    assert pngs >= 1, "the loss curve as PNG"
    assert "throughput:" in text
    assert "has no 'samples'" not in text
    # The logged samples and the merged preset's generations, each prompt once at least.
    assert text.count("'what is 3 plus 4 ?' -> '") >= 2, text
    assert "same text as model.keras: True" in text
    assert "serve it with vLLM: vllm serve" in text and ".safetensors (" in text
    run_dir = tmp_path / "runs" / "gemma_lora_tiny"
    with open(run_dir / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["step"] == 2 * metrics["steps_per_epoch"]
    assert set(metrics["exported"]) >= {"keras", "preset", "safetensors"}
    assert (run_dir / "preset" / "config.json").is_file()
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logdir = os.path.join("runs", "gemma_lora_tiny", "logs")
    assert f"running TensorBoards: [{logdir!r}]" in text
