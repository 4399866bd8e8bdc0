"""connect(): every branch. The CPU fallback runs for real; TPU, GPU and multi-worker run against faked
resolvers, devices and environment variables (no TPU or GPU exists here), so these tests prove the decision
logic and the calls made, not that a real TPU connects."""

import fnmatch
import json
from unittest import mock

import keras
import pytest
import tensorflow as tf

from tpukit.engines.tensorflow import strategy as strategy_lib

NO_ENV: dict = {}


# ---- choose(): the decision, for each environment -------------------------------------------------------------


def test_explicit_tpu_argument_wins_over_everything():
    env = {"TPU_NAME": "other", "COLAB_TPU_ADDR": "10.0.0.1:8470", "TF_CONFIG": "{}"}
    choice = strategy_lib.choose("grpc://10.1.2.3:8470", env=env, tpu_vm=True, gpus=4)
    assert (choice.kind, choice.tpu, choice.explicit) == ("tpu", "grpc://10.1.2.3:8470", True)


def test_tpu_name_env_is_explicit_and_passed_to_the_resolver():
    choice = strategy_lib.choose(env={"TPU_NAME": "local"}, tpu_vm=False, gpus=0)
    assert (choice.kind, choice.tpu, choice.explicit) == ("tpu", "local", True)


def test_legacy_colab_tpu_addr_becomes_grpc_url():
    choice = strategy_lib.choose(env={"COLAB_TPU_ADDR": "10.2.3.4:8470"}, tpu_vm=False, gpus=0)
    assert (choice.kind, choice.tpu, choice.explicit) == ("tpu", "grpc://10.2.3.4:8470", False)


def test_tpu_vm_is_local():
    choice = strategy_lib.choose(env=NO_ENV, tpu_vm=True, gpus=0)
    assert (choice.kind, choice.tpu, choice.explicit) == ("tpu", "local", False)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"COLAB_TPU_1VM": "1"}, True),
        ({"COLAB_TPU_1VM": ""}, False),  # what non-TPU Colab runtimes set
        ({"ISTPUVM": "1"}, True),  # Kaggle
        ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, True),
        ({"TPU_WORKER_ID": "0"}, True),
        ({}, False),
    ],
)
def test_tpu_vm_detection_from_environment(env, expected):
    with mock.patch.object(strategy_lib.glob, "glob", return_value=[]):
        assert strategy_lib.tpu_vm_present(env) is expected


def _fake_dev(paths):
    """A glob.glob over a fake /dev holding `paths`."""
    return lambda pattern: [p for p in paths if fnmatch.fnmatch(p, pattern)]


def test_tpu_vm_detection_from_accel_device_files():
    with mock.patch.object(
        strategy_lib.glob, "glob", side_effect=_fake_dev(["/dev/accel0", "/dev/accel1"])
    ):
        assert strategy_lib.tpu_vm_present({}) is True


@pytest.mark.parametrize("google_pci, expected", [([], False), (["0000:00:05.0"], True)])
def test_vfio_device_files_count_only_with_a_google_pci_device(google_pci, expected):
    # /dev/vfio/<n> exists on any host that passes a PCI device through VFIO (a GPU, a NIC): not a TPU by itself.
    with mock.patch.object(
        strategy_lib.glob, "glob", side_effect=_fake_dev(["/dev/vfio/0", "/dev/vfio/vfio"])
    ):
        with mock.patch.object(strategy_lib, "google_pci_devices", return_value=google_pci):
            assert strategy_lib.tpu_vm_present({}) is expected
            assert strategy_lib.tpu_device_files() == (["/dev/vfio/0"] if expected else [])


def test_google_pci_devices_reads_the_vendor_of_each_pci_device(tmp_path):
    for name, vendor in [
        ("0000:00:04.0", "0x1ae0\n"),
        ("0000:00:05.0", "0x10de\n"),
        ("0000:00:06.0", "0x1AE0"),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor)
    (tmp_path / "0000:00:07.0").mkdir()  # no vendor file: skipped
    assert strategy_lib.google_pci_devices(str(tmp_path)) == ["0000:00:04.0", "0000:00:06.0"]
    assert strategy_lib.google_pci_devices(str(tmp_path / "missing")) == []


def test_tpu_support_is_read_from_the_tensorflow_build():
    # This machine runs the CPU wheel: no TPU kernels, whatever libtpu module may be importable.
    with mock.patch.object(strategy_lib.importlib.util, "find_spec", return_value=object()):
        assert strategy_lib.tensorflow_has_tpu_support() is False
    from tensorflow.python.framework import kernels

    registered = mock.Mock(kernel=[mock.Mock(device_type="TPU")])
    with mock.patch.object(
        kernels, "get_registered_kernels_for_op", return_value=registered
    ) as lookup:
        assert strategy_lib.tensorflow_has_tpu_support() is True
    lookup.assert_called_once_with("TPUExecute")


def test_tf_config_cluster_is_multi_worker_and_beats_gpus():
    tf_config = {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0},
    }
    choice = strategy_lib.choose(env={"TF_CONFIG": json.dumps(tf_config)}, tpu_vm=False, gpus=2)
    assert choice.kind == "multi_worker"
    assert "2 worker" in choice.reason
    assert choice.cluster == tf_config  # build() waits for its workers


def test_an_empty_tf_config_object_is_no_cluster():
    # `{}` is how TensorFlow reads an unset TF_CONFIG; a cluster without a task is refused
    # (tests/engines/tensorflow/test_connect_waits.py has every malformed case).
    choice = strategy_lib.choose(env={"TF_CONFIG": "{}"}, tpu_vm=False, gpus=0)
    assert choice.kind == "default" and choice.cluster is None


def test_bad_tf_config_json_names_the_variable():
    with pytest.raises(ValueError, match=r"TF_CONFIG is not valid JSON.*received '\{oops'"):
        strategy_lib.choose(env={"TF_CONFIG": "{oops"}, tpu_vm=False, gpus=0)


@pytest.mark.parametrize(
    "gpus, kind", [(4, "mirrored"), (2, "mirrored"), (1, "one_device"), (0, "default")]
)
def test_gpu_counts(gpus, kind):
    assert strategy_lib.choose(env=NO_ENV, tpu_vm=False, gpus=gpus).kind == kind


# ---- build(): the strategy objects and TPU calls -----------------------------------------------------------------


def test_connect_on_this_cpu_returns_the_real_default_strategy(monkeypatch):
    for var in ("TPU_NAME", "COLAB_TPU_ADDR", "TF_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(strategy_lib, "tpu_vm_present", lambda env=None: False)
    with mock.patch.object(strategy_lib.logger, "info") as log_info:
        strategy = strategy_lib.connect()
    assert strategy is tf.distribute.get_strategy()
    assert strategy.num_replicas_in_sync == 1
    line = [call.args[0] for call in log_info.call_args_list]
    # One line says, in plain words, what was found and why; the class name stays for those who know it.
    assert line == [
        "tpukit: engine tensorflow, 1 replica on 1 CPU (/device:CPU:0), default strategy "
        "(_DefaultDistributionStrategy) because no TPU, GPU or TF_CONFIG cluster found: CPU; "
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}"
    ]


@pytest.fixture
def fake_tpu():
    """Fakes TPUClusterResolver, connect_to_cluster, initialize_tpu_system and TPUStrategy, and a gRPC server that
    answers at every grpc:// address (`waiting.probe`)."""
    strategy_lib._TPU_STRATEGIES.clear()
    strategy_lib._TPU_TOPOLOGIES.clear()
    with (
        mock.patch.object(tf.distribute.cluster_resolver, "TPUClusterResolver") as resolver,
        mock.patch.object(tf.config, "experimental_connect_to_cluster") as connect_to_cluster,
        mock.patch.object(tf.tpu.experimental, "initialize_tpu_system") as initialize,
        mock.patch.object(tf.distribute, "TPUStrategy") as tpu_strategy,
        mock.patch.object(strategy_lib, "_initialized_tpu_systems", return_value={}),
        mock.patch.object(strategy_lib.waiting, "probe", return_value="open") as probe,
    ):
        yield mock.Mock(
            resolver=resolver,
            connect=connect_to_cluster,
            initialize=initialize,
            strategy=tpu_strategy,
            probe=probe,
        )
    strategy_lib._TPU_STRATEGIES.clear()
    strategy_lib._TPU_TOPOLOGIES.clear()


def test_local_tpu_is_initialized_once_and_not_connected_remotely(fake_tpu):
    choice = strategy_lib.Choice("tpu", "test", tpu="local", explicit=True)
    first = strategy_lib.build(choice)
    second = strategy_lib.build(choice)  # the notebook cell run twice
    assert first is second is fake_tpu.strategy.return_value
    fake_tpu.resolver.assert_called_once_with(tpu="local")
    fake_tpu.connect.assert_not_called()
    fake_tpu.probe.assert_not_called()  # nothing on the network to wait for
    fake_tpu.initialize.assert_called_once_with(fake_tpu.resolver.return_value)
    fake_tpu.strategy.assert_called_once_with(fake_tpu.resolver.return_value)


def test_remote_tpu_is_probed_then_connected_then_initialized(fake_tpu):
    strategy_lib.build(
        strategy_lib.Choice("tpu", "test", tpu="grpc://10.0.0.2:8470", explicit=True)
    )
    fake_tpu.probe.assert_called_once_with("10.0.0.2", 8470, timeout=2.0, handshake=True)
    fake_tpu.resolver.assert_called_once_with(tpu="grpc://10.0.0.2:8470")
    fake_tpu.connect.assert_called_once_with(fake_tpu.resolver.return_value)
    fake_tpu.initialize.assert_called_once()


def test_tpu_already_initialized_by_tensorflow_is_not_reinitialized(fake_tpu):
    with mock.patch.object(
        strategy_lib, "_initialized_tpu_systems", return_value={"local": object()}
    ):
        strategy_lib.build(strategy_lib.Choice("tpu", "test", tpu="local", explicit=True))
    fake_tpu.initialize.assert_not_called()
    fake_tpu.strategy.assert_called_once()


def test_explicit_tpu_failure_says_what_was_tried_and_the_fix(fake_tpu):
    fake_tpu.initialize.side_effect = RuntimeError(
        "Deadline exceeded while connecting"
    )  # not a known error
    with mock.patch.object(strategy_lib, "tensorflow_has_tpu_support", return_value=False):
        with pytest.raises(strategy_lib.TPUConnectionError) as info:
            strategy_lib.build(
                strategy_lib.Choice("tpu", "test", tpu="grpc://10.0.0.2:8470", explicit=True)
            )
    message = str(info.value)
    assert "TPUClusterResolver(tpu='grpc://10.0.0.2:8470')" in message
    assert "Deadline exceeded" in message
    assert "tpu='local'" in message  # the Colab / TPU VM hint
    assert "is not a TPU build" in message and 'tensorflow-tpu==2.19.1" "libtpu==0.0.10"' in message


@pytest.mark.parametrize(
    "error, words",
    [
        (
            ValueError("Please provide a TPU Name to connect to."),
            ["Cause:", "tpukit.connect(tpu='local')"],
        ),
        (
            tf.errors.InvalidArgumentError(
                None,
                None,
                "No OpKernel was registered to support Op 'ConfigureDistributedTPU' used by "
                "{{node ConfigureDistributedTPU}}. Registered devices: [CPU]",
            ),
            ["CPU/GPU wheel", "pip uninstall -y tensorflow", "restart the runtime"],
        ),
    ],
)
def test_known_connection_errors_carry_their_cause_and_fix(fake_tpu, error, words):
    fake_tpu.initialize.side_effect = error
    with pytest.raises(strategy_lib.TPUConnectionError) as info:
        strategy_lib.build(
            strategy_lib.Choice("tpu", "$TPU_NAME='local'", tpu="local", explicit=True)
        )
    message = str(info.value)
    assert "TPUClusterResolver(tpu='local')" in message and str(error)[:40] in message
    for word in words:
        assert word in message


def test_named_tpu_without_the_api_client_fails_first_with_the_install_command(fake_tpu):
    with mock.patch.object(
        strategy_lib, "tpu_api_client_missing", return_value=["google-api-python-client"]
    ):
        with pytest.raises(strategy_lib.TPUConnectionError) as info:
            strategy_lib.build(
                strategy_lib.Choice("tpu", "$TPU_NAME='my-pod'", tpu="my-pod", explicit=True)
            )
        fake_tpu.resolver.assert_not_called()
        message = str(info.value)
        assert "'my-pod'" in message and "pip install google-api-python-client" in message
        assert "tpukit[tpu,tpu-name]" in message and "tpu='local'" in message
        # 'local' and grpc:// addresses never go through the Cloud TPU API.
        strategy_lib.build(strategy_lib.Choice("tpu", "test", tpu="local", explicit=True))
        strategy_lib.build(
            strategy_lib.Choice("tpu", "test", tpu="grpc://10.0.0.3:8470", explicit=True)
        )
    assert fake_tpu.resolver.call_count == 2


def test_api_client_packages_are_looked_up_by_module():
    with mock.patch.object(
        strategy_lib.importlib.util,
        "find_spec",
        side_effect=lambda m: None if m == "oauth2client" else object(),
    ):
        assert strategy_lib.tpu_api_client_missing() == ["oauth2client"]


def test_the_initialized_topology_is_kept_for_the_doctor(fake_tpu):
    strategy_lib.build(strategy_lib.Choice("tpu", "test", tpu="local", explicit=True))
    assert strategy_lib.tpu_topology("local") is fake_tpu.initialize.return_value
    assert strategy_lib.tpu_topology("other") is None


def test_local_tpu_failure_does_not_suggest_local_again(fake_tpu):
    fake_tpu.initialize.side_effect = tf.errors.NotFoundError(
        None, None, "TPUs not found in the cluster."
    )
    with mock.patch.object(strategy_lib, "tensorflow_has_tpu_support", return_value=True):
        with pytest.raises(strategy_lib.TPUConnectionError, match="TPUs not found") as info:
            strategy_lib.build(strategy_lib.Choice("tpu", "test", tpu="local", explicit=True))
    assert "use tpukit.connect(tpu='local')" not in str(info.value)


def test_auto_detected_tpu_failure_falls_back_to_cpu(fake_tpu, monkeypatch):
    fake_tpu.initialize.side_effect = tf.errors.NotFoundError(
        None, None, "TPUs not found in the cluster."
    )
    for var in ("TPU_NAME", "COLAB_TPU_ADDR", "TF_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    with mock.patch.object(strategy_lib, "_gpu_count", return_value=0):
        strategy = strategy_lib.build(
            strategy_lib.Choice("tpu", "TPU VM", tpu="local", explicit=False)
        )
    assert strategy is tf.distribute.get_strategy()


def test_a_tpu_that_stays_silent_times_out_before_tensorflow_connects(fake_tpu):
    fake_tpu.probe.return_value = "silent"
    with pytest.raises(strategy_lib.TPUConnectionError) as info:
        strategy_lib.build(
            strategy_lib.Choice("tpu", "test", tpu="grpc://10.0.0.2:8470", explicit=True),
            tpu_timeout_seconds=1,
        )
    fake_tpu.connect.assert_not_called()
    message = str(info.value)
    assert (
        "(runtime.tpu_timeout_seconds=1), 10.0.0.2:8470 accepts TCP connections but does not answer"
        in message
    )
    assert "--set runtime.tpu_timeout_seconds=60" in message


@pytest.mark.integration
def test_a_tpu_system_that_does_not_initialize_in_time_is_an_error_or_a_fallback(
    fake_tpu, monkeypatch
):
    import threading

    never = threading.Event()
    fake_tpu.initialize.side_effect = lambda resolver: never.wait(30)
    with pytest.raises(strategy_lib.TPUConnectionError) as info:
        strategy_lib.build(
            strategy_lib.Choice("tpu", "test", tpu="local", explicit=True), tpu_timeout_seconds=1
        )
    assert (
        "the TPU system 'local' to initialize (a v4/v5 slice takes 1-3 minutes) did not finish"
        in str(info.value)
    )
    assert "runtime.tpu_timeout_seconds=1" in str(info.value)
    for var in ("TPU_NAME", "COLAB_TPU_ADDR", "TF_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    with mock.patch.object(strategy_lib, "_gpu_count", return_value=0):
        strategy = strategy_lib.build(
            strategy_lib.Choice("tpu", "TPU VM", tpu="local"), tpu_timeout_seconds=1
        )
    assert strategy is tf.distribute.get_strategy()
    never.set()


def test_the_hosts_of_a_named_tpu_are_probed(fake_tpu):
    fake_tpu.resolver.return_value.cluster_spec.return_value.as_dict.return_value = {
        "worker": ["10.0.0.7:8470", "10.0.0.8:8470"]
    }
    with mock.patch.object(strategy_lib, "tpu_api_client_missing", return_value=[]):
        strategy_lib.build(strategy_lib.Choice("tpu", "$TPU_NAME", tpu="my-pod", explicit=True))
    assert [c.args for c in fake_tpu.probe.call_args_list] == [
        ("10.0.0.7", 8470),
        ("10.0.0.8", 8470),
    ]
    fake_tpu.connect.assert_called_once()


def test_gpu_and_multi_worker_choices_build_the_right_strategy_classes():
    with mock.patch.object(tf.distribute, "MirroredStrategy") as mirrored:
        assert (
            strategy_lib.build(strategy_lib.Choice("mirrored", "2 GPUs")) is mirrored.return_value
        )
    with mock.patch.object(tf.distribute, "OneDeviceStrategy") as one:
        assert strategy_lib.build(strategy_lib.Choice("one_device", "1 GPU")) is one.return_value
        one.assert_called_once_with("/gpu:0")
    with mock.patch.object(tf.distribute, "MultiWorkerMirroredStrategy") as mwms:
        assert (
            strategy_lib.build(strategy_lib.Choice("multi_worker", "TF_CONFIG"))
            is mwms.return_value
        )


def test_describe_a_two_replica_strategy(strategy_2):
    assert strategy_lib.describe(strategy_2, "test reason") == (
        "tpukit: engine tensorflow, 2 replicas on 2 CPUs (/device:CPU:0, /device:CPU:1), mirrored strategy "
        f"(MirroredStrategy) because test reason; TensorFlow {tf.__version__}, Keras {keras.__version__}"
    )


def test_the_start_line_counts_devices_by_type_and_names_the_first_four():
    tpu = [f"/job:worker/replica:0/task:0/device:TPU:{i}" for i in range(8)]
    assert strategy_lib.devices_in_words(tpu) == (
        "8 TPU cores (/job:worker/replica:0/task:0/device:TPU:0, /job:worker/replica:0/task:0/device:TPU:1, "
        "/job:worker/replica:0/task:0/device:TPU:2, /job:worker/replica:0/task:0/device:TPU:3, ... (8 in all))"
    )
    assert strategy_lib.devices_in_words(["/job:localhost/replica:0/task:0/device:GPU:0"]) == (
        "1 GPU (/device:GPU:0)"
    )
    assert [strategy_lib.plural(n, "replica") for n in (0, 1, 2)] == [
        "0 replicas",
        "1 replica",
        "2 replicas",
    ]


@pytest.mark.parametrize(
    "cluster, task_type, task_id, expected",
    [
        ({"worker": ["a:1", "b:2"]}, "worker", 0, None),  # worker 0 is the chief when there is none
        ({"worker": ["a:1", "b:2"]}, "worker", 1, "worker1"),
        ({"chief": ["c:0"], "worker": ["a:1"]}, "chief", 0, None),
        ({"chief": ["c:0"], "worker": ["a:1"]}, "worker", 0, "worker0"),
    ],
)
def test_non_chief_workers_write_to_their_own_subdirectory(cluster, task_type, task_id, expected):
    resolver = mock.Mock(task_type=task_type, task_id=task_id)
    resolver.cluster_spec.return_value.as_dict.return_value = cluster
    fake = mock.Mock(cluster_resolver=resolver)
    with mock.patch.object(strategy_lib, "kind_of", return_value="multi_worker"):
        assert strategy_lib.worker_subdir(fake) == expected
    assert strategy_lib.worker_subdir(tf.distribute.get_strategy()) is None
