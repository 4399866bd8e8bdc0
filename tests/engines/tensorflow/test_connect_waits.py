"""Issue 19, items 5 and 6: a malformed TF_CONFIG is refused before anything else, and the waits for a TPU and for a
cluster's workers are bounded, logged, answer SIGTERM, and end with the cause and the fix.

Default tier: every TF_CONFIG case through `parse_tf_config` (and through the CLI, in this process: it stops before
anything is built), the probes and waits against real sockets on 127.0.0.1, a refused TPU address (explicit: an
error; `$COLAB_TPU_ADDR`: the CPU, with a warning) in this process (the probe fails before TensorFlow's connect, which
could configure this process's TensorFlow context for good, is called), and a listener that accepts TCP but never
speaks gRPC through the real command. Cluster tier: real worker processes on 127.0.0.1 for a peer that never comes,
SIGTERM while waiting, the same command finishing once every worker runs, and a real TensorFlow gRPC server that is
no TPU.
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from unittest import mock

import faults
import pytest
import tensorflow as tf
from helpers import REPO, finish_processes, free_ports, run_cli, train_in_process

from tpukit.engines.tensorflow import strategy as strategy_lib
from tpukit.engines.tensorflow import waiting

TWO_WORKERS = {"cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"]}}


def _config(**changes):
    config = {
        "cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"]},
        "task": {"type": "worker", "index": 0},
    }
    config.update(changes)
    return json.dumps(config)


# ---- TF_CONFIG validation (item 6) -------------------------------------------------------------------------------

MALFORMED = [
    ("{oops", "is not valid JSON (Expecting property name"),
    ("[1,2]", "must be a JSON object with 'cluster' and 'task', not a JSON array"),
    ('"worker"', "not a JSON string"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "has no 'cluster'"),
    (_config(cluster={}), "'cluster' must be a non-empty object"),
    (_config(cluster=["127.0.0.1:2001"]), "'cluster' must be a non-empty object"),
    (_config(cluster={"worker": "127.0.0.1:2001"}), "cluster['worker'] must be a non-empty list"),
    (_config(cluster={"worker": []}), "cluster['worker'] must be a non-empty list"),
    (_config(cluster={"ps": ["127.0.0.1:2001"]}), "'cluster' has no 'worker' or 'chief' task"),
    (json.dumps(TWO_WORKERS), "has a 'cluster' but no 'task'"),
    (_config(task=[0]), "'task' must be an object"),
    (
        _config(task={"index": 0}),
        "task type None is not one of the cluster's task types ('worker')",
    ),
    (_config(task={"type": "chief", "index": 0}), "task type 'chief' is not one of"),
    (_config(task={"type": "worker", "index": "one"}), "task index 'one' is not a whole number"),
    (_config(task={"type": "worker", "index": True}), "task index True is not a whole number"),
    (_config(task={"type": "worker"}), "task index None is not a whole number"),
    (
        _config(task={"type": "worker", "index": 2}),
        "task index 2 is out of range: cluster['worker'] has 2 address(es), so the index is 0 to 1",
    ),
    (_config(task={"type": "worker", "index": -1}), "task index -1 is out of range"),
    (
        _config(cluster={"worker": ["127.0.0.1"]}),
        "cluster['worker'][0] is not an address: '127.0.0.1' has no port",
    ),
    (
        _config(cluster={"worker": ["h:0"]}),
        "'h:0' has port '0': a port is a number from 1 to 65535",
    ),
    (_config(cluster={"worker": ["h:65536"]}), "'h:65536' has port '65536'"),
    (_config(cluster={"worker": ["h:port"]}), "'h:port' has port 'port'"),
    (
        _config(cluster={"worker": ["::1:2222"]}),
        "an IPv6 address goes in brackets, e.g. [::1]:2222",
    ),
    (_config(cluster={"worker": ["[::zz]:2222"]}), "'[::zz]:2222' is not [IPv6 address]:port"),
    (
        _config(cluster={"worker": ["grpc://h:2222"]}),
        "has a scheme: write host:port without 'grpc://'",
    ),
    (_config(cluster={"worker": ["my host:2222"]}), "has no valid host name or IP address"),
    (_config(cluster={"worker": [2222]}), "an address must be a string 'host:port', not int"),
    (
        _config(cluster={"worker": ["h:1", "h:1"]}),
        "lists 'h:1' twice (worker 0 and worker 1): each task needs its own host:port",
    ),
]


@pytest.mark.parametrize("text, problem", MALFORMED)
def test_malformed_tf_config_names_the_variable_the_problem_the_value_and_the_fix(text, problem):
    with pytest.raises(strategy_lib.TFConfigError) as info:
        strategy_lib.parse_tf_config(text)
    message = str(info.value)
    assert isinstance(info.value, ValueError)  # the engine maps it to RecipeError: exit 2
    assert message.startswith("TF_CONFIG ") and problem in message
    assert f"received {text[:200]!r}" in message
    fix = message.split(". Fix: ")[1]
    assert '{"cluster": {"worker": ["host1:2222", "host2:2222"]}' in fix  # an example to copy


def test_the_value_shown_is_bounded():
    text = _config(cluster={"worker": [f"worker-{i}.example.com:2222" for i in range(50)]}, task={})
    with pytest.raises(strategy_lib.TFConfigError) as info:
        strategy_lib.parse_tf_config(text)
    assert f"received {text[:200]!r} ... ({len(text)} characters)" in str(info.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("{}", None),  # TensorFlow's own reading of an unset TF_CONFIG
        (_config(), "worker 0"),
        (_config(task={"type": "worker", "index": "1"}), "worker 1"),  # TensorFlow reads int(index)
        (
            json.dumps(
                {
                    "cluster": {"chief": ["[::1]:2000"], "worker": ["h-1.example:2001"]},
                    "task": {"type": "chief", "index": 0},
                    "environment": "cloud",
                }
            ),
            "chief 0",
        ),
    ],
)
def test_valid_tf_config(text, expected):
    config = strategy_lib.parse_tf_config(text)
    if expected is None:
        assert config is None
    else:
        task = config["task"]
        assert f"{task['type']} {strategy_lib.task_index(task)}" == expected


def test_tf_config_is_validated_before_anything_else_is_chosen():
    # Even a TPU asked for does not skip it: the broken variable would break the next run without --tpu.
    with pytest.raises(strategy_lib.TFConfigError, match="has a 'cluster' but no 'task'"):
        strategy_lib.choose("local", env={"TF_CONFIG": json.dumps(TWO_WORKERS)}, tpu_vm=True)


@pytest.mark.parametrize(
    "text, words",
    [
        ("[1,2]", "TF_CONFIG must be a JSON object with 'cluster' and 'task', not a JSON array"),
        (json.dumps(TWO_WORKERS), "TF_CONFIG has a 'cluster' but no 'task'"),
        (_config(task={"type": "worker", "index": 5}), "TF_CONFIG task index 5 is out of range"),
    ],
)
def test_the_cli_exits_2_on_a_malformed_tf_config_and_writes_nothing(
    tmp_path, monkeypatch, text, words
):
    monkeypatch.setenv("TF_CONFIG", text)
    output_dir = tmp_path / "run"
    result = train_in_process("recipes/digits_cnn.yaml", "--output_dir", str(output_dir))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"tpukit: error: {words}") and "Fix: " in result.stderr
    assert "Traceback" not in result.stderr and not output_dir.exists()


def test_the_doctor_reports_a_malformed_tf_config_as_a_finding(monkeypatch):
    from tpukit.tools import doctor

    monkeypatch.setenv("TF_CONFIG", "[1,2]")
    runtime = doctor.detect_runtime(
        tpu_device_files=[], gpu_device_files=[], colab_module=False, kaggle_dir=False
    )
    assert runtime.accelerator == "cpu"  # detecting the machine does not stop at TF_CONFIG
    details, [finding] = doctor.check_accelerator(runtime)
    assert details == {} and (finding.level, finding.topic) == ("fail", "accelerator")
    assert finding.message.startswith(
        "connecting with tpu=None failed: TFConfigError: TF_CONFIG must be a JSON object"
    )


# ---- addresses and probes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:8470", ("127.0.0.1", 8470)),
        ("worker-0.svc.cluster.local:2222", ("worker-0.svc.cluster.local", 2222)),
        ("[::1]:2222", ("::1", 2222)),
        ("[fe80::1]:65535", ("fe80::1", 65535)),
    ],
)
def test_parse_address(text, expected):
    assert waiting.parse_address(text) == expected


@contextlib.contextmanager
def listener(reply: bytes | None = None):
    """A TCP server thread on 127.0.0.1 that accepts connections and then sends `reply`, or nothing (None)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop, connections = threading.Event(), []

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            connections.append(connection)
            if reply is not None:
                connection.recv(1024)
                connection.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for connection in connections:
            connection.close()
        server.close()


# The first frame a gRPC server sends: SETTINGS (type 4), here with no settings.
HTTP2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def test_probe_tells_each_kind_of_address_apart():
    [closed_port] = free_ports(1)
    assert waiting.probe("127.0.0.1", closed_port) == "refused"
    assert waiting.probe("127.0.0.1", closed_port, handshake=True) == "refused"
    assert waiting.probe("no-such-host.invalid", 8470) == "unresolvable"
    with listener() as port:
        assert waiting.probe("127.0.0.1", port) == "open"
        started = time.monotonic()
        assert waiting.probe("127.0.0.1", port, timeout=0.3, handshake=True) == "silent"
        assert time.monotonic() - started < 5
    with listener(HTTP2_SETTINGS) as port:
        assert waiting.probe("127.0.0.1", port, handshake=True) == "open"
    with listener(b"HTTP/1.1 400 Bad Request\r\n\r\n") as port:
        assert waiting.probe("127.0.0.1", port, handshake=True) == "not_grpc"


def test_a_placeholder_listens_drains_and_frees_its_port():
    [port] = free_ports(1)
    with waiting.Placeholder(port) as placeholder:
        assert placeholder.listening
        for _ in range(300):  # more than a listen backlog: drained, never full
            assert waiting.probe("127.0.0.1", port, timeout=1) == "open"
            placeholder.drain()
        assert not waiting.Placeholder(port).listening  # taken: not an error, TensorFlow reports it
    assert waiting.probe("127.0.0.1", port) == "refused"
    socket.create_server(("", port)).close()  # free for TensorFlow's server


# ---- the waits: timeouts, progress lines, signals ----------------------------------------------------------------


def test_wait_until_logs_its_progress_and_gives_up_at_the_timeout(monkeypatch):
    monkeypatch.setattr(waiting, "LOG_INTERVAL_SECONDS", 0.2)
    with mock.patch.object(waiting.logger, "info") as info:
        started = time.monotonic()
        done, progress, elapsed = waiting.wait_until(
            lambda left: (False, "1 of 2 here"), 1.0, "the test", "runtime.test_seconds", 0.05
        )
    assert (done, progress) == (False, "1 of 2 here") and 1.0 <= elapsed < 5
    assert time.monotonic() - started < 5
    lines = [call.args[0] % call.args[1:] for call in info.call_args_list]
    assert (
        lines[0] == "tpukit: waiting for the test: 1 of 2 here; 0 s of 1 s (runtime.test_seconds)"
    )
    assert 3 <= len(lines) <= 8  # one at the start, then one per 0.2 s


def test_sigterm_and_ctrl_c_stop_a_wait_with_what_it_waited_for_and_the_handlers_come_back():
    # A suite started with `&` from a script inherits SIGINT ignored, which the wait keeps ignored on purpose (the
    # next test): here both signals are handled, as in a terminal.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _stop_a_wait_by_signals()
    finally:
        signal.signal(signal.SIGINT, inherited)


def _stop_a_wait_by_signals():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    for signum in (signal.SIGTERM, signal.SIGINT):
        calls = []

        def poll(left, signum=signum, calls=calls):
            calls.append(left)
            if len(calls) == 2:
                os.kill(os.getpid(), signum)
            return False, "worker 1 not listening yet"

        with pytest.raises(waiting.WaitInterrupted) as info:
            waiting.wait_until(poll, 60, "the workers", "runtime.workers_timeout_seconds", 0.05)
        assert info.value.signum == signum and len(calls) == 2
        name = signal.Signals(signum).name
        assert isinstance(info.value, KeyboardInterrupt)  # not swallowed by `except Exception`
        assert str(info.value).startswith(
            f"tpukit: stopped by {name} after 0 s while waiting for the workers; worker 1 not listening yet; "
            "nothing was trained or written."
        )
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_an_ignored_signal_stays_ignored_and_other_threads_install_nothing():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with waiting.interruptible(lambda: "x"):
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)
    seen = []

    def in_a_thread():
        with waiting.interruptible(lambda: "x"):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGTERM)]


def test_call_bounded_returns_raises_and_times_out(monkeypatch):
    assert waiting.call_bounded(lambda: 42, 5, "the answer") == 42
    with pytest.raises(KeyError, match="lost"):
        waiting.call_bounded(lambda: {}["lost"], 5, "a lookup")
    monkeypatch.setattr(waiting, "LOG_INTERVAL_SECONDS", 0.2)
    release = threading.Event()
    with mock.patch.object(waiting.logger, "info") as info:
        started = time.monotonic()
        with pytest.raises(
            waiting.BoundedCallTimeout, match="the TPU system to initialize did not"
        ):
            waiting.call_bounded(release.wait, 1.0, "the TPU system to initialize")
    release.set()
    assert time.monotonic() - started < 5
    assert "tpukit: waiting for %s; %.0f s of %.0f s" in [c.args[0] for c in info.call_args_list]


# ---- a cluster's workers (item 5), in this process: only sockets -------------------------------------------------


def _cluster(own_index, addresses, task_type="worker"):
    return {
        "cluster": {"worker": addresses},
        "task": {"type": task_type, "index": own_index},
    }


def test_waiting_for_a_worker_that_never_comes_names_it_and_the_fix():
    own, missing = (f"127.0.0.1:{port}" for port in free_ports(2))
    started = time.monotonic()
    with pytest.raises(strategy_lib.ClusterUnreachableError) as info:
        strategy_lib.wait_for_workers(_cluster(0, [own, missing]), timeout=1.5)
    assert time.monotonic() - started < 10
    message = str(info.value)
    # The seconds waited, as printed (2 here; more when a loaded machine wakes the wait late).
    assert re.search(
        r"did not all start within \d+ s \(runtime\.workers_timeout_seconds=1\.5\)", message
    )
    assert f"0 of 1 other worker(s) reachable (worker 1 at {missing} not listening yet)" in message
    assert f"This is worker 0 ({own}); nothing was trained or written." in message
    assert "--set runtime.workers_timeout_seconds=60" in message
    assert "workers_timeout_seconds=60)" in message  # the Python argument


def test_workers_see_each_other_while_they_wait():
    # Worker 1 waits (listening on its own port); worker 0, here a thread, starts a second later; both stop waiting,
    # and then listen as TensorFlow's server would.
    ports = free_ports(2)
    addresses = [f"127.0.0.1:{port}" for port in ports]
    results, servers = {}, []

    def worker(index):
        try:
            strategy_lib.wait_for_workers(_cluster(index, addresses), timeout=20)
            servers.append(
                socket.create_server(("", ports[index]))
            )  # the port is free: TensorFlow's
            results[index] = "up"
        except Exception as error:  # noqa: BLE001 - reported by the assertion
            results[index] = repr(error)

    later = threading.Thread(target=lambda: (time.sleep(1), worker(0)))
    later.start()
    started = time.monotonic()
    worker(1)  # in the main thread: the signal handlers are installed
    later.join()
    for server in servers:
        server.close()
    assert results == {0: "up", 1: "up"}
    assert time.monotonic() - started < 10


def test_an_evaluator_and_a_one_worker_cluster_do_not_wait():
    [port] = free_ports(1)
    missing = f"127.0.0.1:{port}"
    config = {
        "cluster": {"worker": [missing], "evaluator": ["127.0.0.1:1"]},
        "task": {"type": "evaluator", "index": 0},
    }
    strategy_lib.wait_for_workers(config, timeout=0.1)
    strategy_lib.wait_for_workers(_cluster(0, [missing]), timeout=0.1)


# ---- a TPU address where nothing listens (item 5), in this process: the probe fails before TensorFlow connects ----


@pytest.fixture
def no_tensorflow_connect(monkeypatch):
    """Fails the test if TensorFlow's connect or TPU initialization is reached."""
    for var in ("TPU_NAME", "COLAB_TPU_ADDR", "TF_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(strategy_lib, "tpu_vm_present", lambda env=None: False)
    with (
        mock.patch.object(tf.config, "experimental_connect_to_cluster") as connect,
        mock.patch.object(tf.tpu.experimental, "initialize_tpu_system") as initialize,
    ):
        yield
    connect.assert_not_called()
    initialize.assert_not_called()


def test_an_explicit_tpu_where_nothing_listens_fails_within_seconds(no_tensorflow_connect):
    [port] = free_ports(1)
    started = time.monotonic()
    with pytest.raises(strategy_lib.TPUConnectionError) as info:
        strategy_lib.connect(f"grpc://127.0.0.1:{port}")
    assert time.monotonic() - started < 10  # not at the 600 s timeout
    message = str(info.value)
    assert f"127.0.0.1:{port} refuses connections: nothing listens on that port" in message
    assert f"tried because tpu='grpc://127.0.0.1:{port}' was requested" in message
    assert "a TPU Node's gRPC port is 8470" in message and "tpu='local'" in message


def test_an_auto_detected_colab_tpu_where_nothing_listens_falls_back_to_the_cpu(
    no_tensorflow_connect, monkeypatch
):
    [port] = free_ports(1)
    monkeypatch.setenv("COLAB_TPU_ADDR", f"127.0.0.1:{port}")
    with (
        mock.patch.object(strategy_lib, "_gpu_count", return_value=0),
        mock.patch.object(strategy_lib.logger, "warning") as warning,
    ):
        started = time.monotonic()
        strategy = strategy_lib.connect()
    assert time.monotonic() - started < 10
    assert strategy is tf.distribute.get_strategy()
    [call] = warning.call_args_list
    assert call.args[0] == "tpukit: TPU auto-detection failed, falling back: %s"
    assert f"127.0.0.1:{port} refuses connections" in str(call.args[1])


def test_the_cli_exits_1_within_seconds_for_a_tpu_where_nothing_listens(
    tmp_path, no_tensorflow_connect
):
    [port] = free_ports(1)
    output_dir = tmp_path / "run"
    started = time.monotonic()
    result = train_in_process(
        "recipes/digits_cnn.yaml",
        "--output_dir",
        str(output_dir),
        "--tpu",
        f"grpc://127.0.0.1:{port}",
    )
    assert time.monotonic() - started < 30
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.startswith(
        f"tpukit: error: could not connect to the TPU: 127.0.0.1:{port} refuses connections"
    )
    assert "Traceback" not in result.stderr and not output_dir.exists()


# ---- a TPU address that accepts TCP and never answers gRPC: the real command ------------------------------------


@pytest.mark.integration
def test_a_tpu_that_never_answers_ends_at_the_timeout_with_progress_lines_cause_and_fix(tmp_path):
    output_dir = tmp_path / "run"
    with listener() as port:
        started = time.monotonic()
        result = run_cli(
            "recipes/digits_cnn.yaml",
            "--output_dir",
            str(output_dir),
            "--tpu",
            f"grpc://127.0.0.1:{port}",
            "--set",
            "runtime.tpu_timeout_seconds=5",
            env=dict(os.environ, **faults.env(wait_log_seconds=1)),
            timeout=120,
        )
        took = time.monotonic() - started
    assert result.returncode == 1, result.stderr[-3000:]
    assert took < 60
    waits = [line for line in result.stderr.splitlines() if line.startswith("tpukit: waiting for")]
    assert len(waits) >= 2, result.stderr[-3000:]  # probes of 2 s, a line after each
    assert waits[0].startswith(
        f"tpukit: waiting for the TPU at 127.0.0.1:{port} to answer: 127.0.0.1:{port} accepts TCP "
        "connections but does not answer gRPC (yet); "
    ) and waits[0].endswith(" of 5 s (runtime.tpu_timeout_seconds)")
    error = result.stderr.split("tpukit: error: ")[1]
    assert re.match(
        r"could not connect to the TPU: after \d+ s \(runtime\.tpu_timeout_seconds=5\)", error
    )
    assert "--set runtime.tpu_timeout_seconds=60" in error and "that the TPU is READY" in error
    assert "Traceback" not in result.stderr and not output_dir.exists()


# ---- cluster tier: real worker processes on 127.0.0.1 ------------------------------------------------------------

DIGITS = [
    "recipes/digits_cnn.yaml",
    "--set",
    "train.epochs=1",
    "--set",
    "data.global_batch_size=32",
    "--set",
    "runtime.steps_per_execution=2",
]


def _start_worker(index, workers, output_dir, log_path, *extra):
    """`python -m tpukit.train` as task `worker index` of a cluster of `workers` (each its own TF_CONFIG)."""
    env = dict(
        os.environ,
        TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        ),
        TF_CPP_MIN_LOG_LEVEL="2",
        KERAS_BACKEND="tensorflow",
        CUDA_VISIBLE_DEVICES="",
        **faults.env(wait_log_seconds=2),
    )
    command = [
        sys.executable,
        "-m",
        "tpukit.train",
        *DIGITS,
        "--output_dir",
        str(output_dir),
        *extra,
    ]
    log = open(log_path, "w")
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), log


@pytest.mark.cluster
def test_a_worker_whose_peer_never_starts_exits_1_naming_it_then_the_same_command_trains(tmp_path):
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    output_dir = tmp_path / "run"
    timeout = ("--set", "runtime.workers_timeout_seconds=10")
    started = time.monotonic()
    codes = finish_processes(
        [_start_worker(0, workers, output_dir, tmp_path / "alone.log", *timeout)], 120
    )
    took = time.monotonic() - started
    log = (tmp_path / "alone.log").read_text()
    assert codes == [1], log[-3000:]
    assert took < 60 and "Traceback" not in log
    assert (
        f"waiting for the 2 workers of the TF_CONFIG cluster to start (this is worker 0, {workers[0]}): "
        f"0 of 1 other worker(s) reachable (worker 1 at {workers[1]} not listening yet)"
    ) in log
    error = log.split("tpukit: error: ")[1]
    assert error.startswith(
        "the workers of the TF_CONFIG cluster did not all start within 10 s (runtime.workers_timeout_seconds=10)"
    )
    assert f"worker 1 at {workers[1]} not listening yet" in error and "nothing was trained" in error
    assert not output_dir.exists()

    # The cause gone (both workers started, worker 1 a few seconds later), the same command trains.
    first = _start_worker(0, workers, output_dir, tmp_path / "worker0.log", *timeout)
    time.sleep(3)
    second = _start_worker(1, workers, output_dir, tmp_path / "worker1.log", *timeout)
    codes = finish_processes([first, second], 600)
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "all 2 workers of the TF_CONFIG cluster are up" in logs[0]
    metrics = json.loads((output_dir / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["step"] == 1437 // 32


@pytest.mark.cluster
def test_sigterm_ends_a_waiting_worker_within_seconds_with_one_line(tmp_path):
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    process, log = _start_worker(1, workers, tmp_path / "run", tmp_path / "worker1.log")
    try:
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline
            and "waiting for the 2 workers" not in (tmp_path / "worker1.log").read_text()
        ):
            assert process.poll() is None, (tmp_path / "worker1.log").read_text()[-3000:]
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        process.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    text = (tmp_path / "worker1.log").read_text()
    assert process.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert took < 10 and "Traceback" not in text
    [line] = [line for line in text.splitlines() if "stopped by SIGTERM" in line]
    assert line.startswith("tpukit: stopped by SIGTERM after ")
    assert (
        f"worker 0 at {workers[0]} not listening yet" in line
        and "Run the same command again" in line
    )
    assert not (tmp_path / "run").exists()


SERVER = """
import sys
import tensorflow as tf
server = tf.distribute.Server({"worker": [sys.argv[1]]}, job_name="worker", task_index=0, protocol="grpc")
print("listening", flush=True)
server.join()
"""


@pytest.mark.cluster
def test_a_grpc_server_that_is_no_tpu_fails_with_the_cause_not_a_hang(tmp_path):
    # A real TensorFlow gRPC server: the probe passes, TensorFlow connects, and the TPU initialization (in its
    # thread) fails at once: the error comes back through the waiting thread.
    [port] = free_ports(1)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, f"127.0.0.1:{port}"],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "listening"
        result = run_cli(
            "recipes/digits_cnn.yaml",
            "--output_dir",
            str(tmp_path / "run"),
            "--tpu",
            f"grpc://127.0.0.1:{port}",
            timeout=120,
        )
    finally:
        server.kill()
        server.wait()
    assert result.returncode == 1, result.stderr[-3000:]
    assert "initializing the TPU system failed with NotFoundError: TPUs not found" in result.stderr
    assert "Traceback" not in result.stderr
