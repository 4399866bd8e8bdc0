"""Shared test helpers: running the CLI in a subprocess and building small recipes."""

import contextlib
import json
import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))
)  # tests/helpers.py -> the repository
RECIPES = os.path.join(REPO, "recipes")


def run_cli(
    *args: str, cwd: str | None = None, timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    env = dict(env or os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    return subprocess.run(
        [sys.executable, "-m", "tpukit.train", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env,
        timeout=timeout,
    )


def train_in_process(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    """`python -m tpukit.train ARGS` run in this process (flag parsing, the recipe, the plan, the exit status and
    what it prints), for the cases where a subprocess would prove nothing more than its ~5 s TensorFlow start."""
    import contextlib
    import io

    from tpukit import train

    stdout, stderr = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    os.chdir(cwd or REPO)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = train.main(train.parse_flags(["tpukit.train", *args]))
            except SystemExit as exit_:  # parse_flags: a flag absl refuses
                status = exit_.code
    finally:
        train.FLAGS.unparse_flags()
        os.chdir(previous)
    return subprocess.CompletedProcess(args, status, stdout.getvalue(), stderr.getvalue())


def digits_recipe(**overrides):
    """The digits_cnn recipe as a dict with `section.key` overrides applied (small and fast)."""
    import yaml

    with open(os.path.join(RECIPES, "digits_cnn.yaml")) as f:
        raw = yaml.safe_load(f)
    for dotted, value in overrides.items():
        section, key = dotted.split("__") if "__" in dotted else dotted.split(".")
        raw[section][key] = value
    return raw


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(log_dir, args_for, count: int = 2, timeout: int = 300, env_for=None) -> list[int]:
    """Runs `args_for(index)` as `count` MultiWorkerMirroredStrategy workers on 127.0.0.1 (TF_CONFIG each) and
    returns their exit codes; each worker's output goes to `log_dir/worker{index}.log`. Bounded by `timeout`.
    `env_for(index)`, if given, adds environment variables for one worker."""
    workers = [f"127.0.0.1:{port}" for port in free_ports(count)]
    processes = []
    for index in range(count):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps(tf_config),
            TF_CPP_MIN_LOG_LEVEL="2",
            KERAS_BACKEND="tensorflow",
            CUDA_VISIBLE_DEVICES="",
            **(env_for(index) if env_for else {}),
        )
        log = open(os.path.join(log_dir, f"worker{index}.log"), "w")
        processes.append(
            (
                subprocess.Popen(
                    args_for(index), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
                ),
                log,
            )
        )
    return finish_processes(processes, timeout)


def finish_processes(processes, timeout: int) -> list[int]:
    """Waits for `(process, log file)` pairs up to `timeout` seconds each, kills what is left, closes the logs and
    returns the exit codes."""
    try:
        for process, _ in processes:
            process.wait(timeout=timeout)
    finally:
        for process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return [process.returncode for process, _ in processes]


JAX_CHILD = os.path.join(REPO, "tests", "engines", "jax", "child.py")


def run_jax(
    config: dict,
    devices: int = 8,
    timeout: int = 600,
    env: dict | None = None,
    all_results: bool = False,
):
    """(returncode, the RESULT dict or None, the output) of tests/engines/jax/child.py, a jax-engine run in a
    process of its own (this process's Keras is on TensorFlow), with `devices` virtual CPU devices; every RESULT
    (a list) with `all_results`."""
    environment = dict(
        env or os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        KERAS_BACKEND="jax",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    done = subprocess.run(
        [sys.executable, JAX_CHILD, json.dumps(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    results = [
        json.loads(line[len("RESULT ") :])
        for line in done.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    return done.returncode, (results if all_results else results[0] if results else None), output


def run_jax_snippet(
    code: str, case: str, drop: tuple[str, ...] = (), timeout: int = 300, **env
) -> dict:
    """The RESULT dict that Python `code` prints (a line `RESULT <json>`), run with `case` as its argument in a
    JAX-backend CPU process of its own (for what holds once per process: $XLA_FLAGS, lowering rules), with the
    variables `drop` left out of this process's environment and `env` set; fails the test with the output if the
    process fails or prints no result."""
    environment = {k: v for k, v in os.environ.items() if k not in drop}
    environment.update(
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    environment.update(env)
    environment = {k: v for k, v in environment.items() if v is not None}  # None: left unset
    done = subprocess.run(
        [sys.executable, "-c", code, case],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[0][len("RESULT ") :])


def expected_xla_cpu_flags(xla_flags: str = "") -> list[str]:
    """The XLA:CPU flags a jax-engine process starting with `xla_flags` adds, with the installed jaxlib, TensorFlow
    and accelerators (`tpukit.engines.jax.cpu.cpu_xla_flags`, `accelerator_hints`)."""
    from importlib import metadata

    import tensorflow as tf

    from tpukit.engines.jax import cpu

    wanted = cpu.cpu_xla_flags(metadata.version("jaxlib"), tf.__version__, xla_flags)[0]
    return [] if cpu.accelerator_hints() else wanted


# The recommender recipe, smoke-sized for the engines' tests: 4,000 ratings (3,200 train = 12 steps of 256 an
# epoch; 800 test), 2 epochs, a checkpoint every 8 steps.
DCN_RECIPE = os.path.join(RECIPES, "movielens_dcn.yaml")
DCN_SMALL = [
    "data.num_ratings=4000",
    "data.global_batch_size=256",
    "train.epochs=2",
    "train.warmup_steps=4",
    "runtime.checkpoint_every_steps=8",
    "runtime.verbose=0",
]


def dcn_mean_rating_rmse() -> float:
    """movielens_dcn's trivial baseline, recomputed from its data: predict the training ratings' mean."""
    import numpy as np

    from tpukit.data.movielens import movielens_synthetic

    train = np.array([float(y) for _, y in movielens_synthetic("train")])
    test = np.array([float(y) for _, y in movielens_synthetic("test")])
    return float(np.sqrt(np.mean((test - train.mean()) ** 2)))


def model_weights(path) -> list:
    """Every weight of a saved `.keras` model, as NumPy arrays (read on this process's backend)."""
    import keras
    import numpy as np

    return [np.asarray(w) for w in keras.saving.load_model(path, compile=False).weights]


def loss_recorder():
    """A Keras callback whose `.losses` collects the logged loss after every training batch."""
    import keras

    class LossRecorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))

    return LossRecorder()


def jax_cluster_env(port: int, index: int) -> dict:
    """The environment of process `index` of a 2-process JAX cluster on 127.0.0.1:`port`, 4 virtual CPU devices
    each (the jax engine's multi-process tests)."""
    return dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        KERAS_BACKEND="jax",
        TF_CPP_MIN_LOG_LEVEL="2",
        TPUKIT_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        TPUKIT_NUM_PROCESSES="2",
        TPUKIT_PROCESS_ID=str(index),
        PYTHONPATH=REPO,
    )


@contextlib.contextmanager
def mounted_tmpfs(mount, size: str):
    """A tmpfs of `size` ("12m") mounted at the new directory `mount` (root only: the test skips, saying why, where
    mounting is refused), unmounted after."""
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode:
        pytest.skip(
            f"cannot mount a tmpfs here ({result.stderr.strip()}): the fault cannot be made"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def tiny_gemma_backbone(vocabulary_size: int = 64, num_layers: int = 1):
    """A KerasHub GemmaBackbone small enough for a unit test, from a config (no download): 2 query heads, 1
    key/value head of 8, hidden 16, MLP 32. Callers seed Keras first where they compare weights."""
    import keras_hub

    return keras_hub.models.GemmaBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=num_layers,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
    )
