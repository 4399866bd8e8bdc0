"""connect(): every branch. The CPU fallback runs for real; TPU, GPU and multi-worker run against faked
resolvers, devices and environment variables (no TPU or GPU exists here), so these tests prove the decision
logic and the calls made, not that a real TPU connects."""

import json
from unittest import mock

import pytest
import tensorflow as tf

from tpukit import strategy as strategy_lib

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


def test_tpu_vm_detection_from_device_files():
    with mock.patch.object(strategy_lib.glob, "glob", side_effect=lambda p: ["/dev/vfio/0"] if "vfio" in p else []):
        assert strategy_lib.tpu_vm_present({}) is True


def test_tf_config_cluster_is_multi_worker_and_beats_gpus():
    tf_config = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
    choice = strategy_lib.choose(env={"TF_CONFIG": json.dumps(tf_config)}, tpu_vm=False, gpus=2)
    assert choice.kind == "multi_worker"
    assert "2 worker" in choice.reason


def test_tf_config_without_cluster_is_ignored():
    choice = strategy_lib.choose(env={"TF_CONFIG": json.dumps({"task": {}})}, tpu_vm=False, gpus=0)
    assert choice.kind == "default"


def test_bad_tf_config_json_names_the_variable():
    with pytest.raises(ValueError, match=r"TF_CONFIG is not valid JSON.*received '\{oops'"):
        strategy_lib.choose(env={"TF_CONFIG": "{oops"}, tpu_vm=False, gpus=0)


@pytest.mark.parametrize("gpus, kind", [(4, "mirrored"), (2, "mirrored"), (1, "one_device"), (0, "default")])
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
    assert len(line) == 1  # one line says what was chosen and why
    assert "default" in line[0] and "1 replica(s)" in line[0] and "no TPU, GPU or TF_CONFIG" in line[0]
    assert f"TensorFlow {tf.__version__}" in line[0]


@pytest.fixture
def fake_tpu():
    """Fakes TPUClusterResolver, connect_to_cluster, initialize_tpu_system and TPUStrategy."""
    strategy_lib._TPU_STRATEGIES.clear()
    with mock.patch.object(tf.distribute.cluster_resolver, "TPUClusterResolver") as resolver, mock.patch.object(
        tf.config, "experimental_connect_to_cluster"
    ) as connect_to_cluster, mock.patch.object(
        tf.tpu.experimental, "initialize_tpu_system"
    ) as initialize, mock.patch.object(tf.distribute, "TPUStrategy") as tpu_strategy, mock.patch.object(
        strategy_lib, "_initialized_tpu_systems", return_value={}
    ):
        yield mock.Mock(resolver=resolver, connect=connect_to_cluster, initialize=initialize, strategy=tpu_strategy)
    strategy_lib._TPU_STRATEGIES.clear()


def test_local_tpu_is_initialized_once_and_not_connected_remotely(fake_tpu):
    choice = strategy_lib.Choice("tpu", "test", tpu="local", explicit=True)
    first = strategy_lib.build(choice)
    second = strategy_lib.build(choice)  # the notebook cell run twice
    assert first is second is fake_tpu.strategy.return_value
    fake_tpu.resolver.assert_called_once_with(tpu="local")
    fake_tpu.connect.assert_not_called()
    fake_tpu.initialize.assert_called_once_with(fake_tpu.resolver.return_value)
    fake_tpu.strategy.assert_called_once_with(fake_tpu.resolver.return_value)


def test_remote_tpu_is_connected_then_initialized(fake_tpu):
    strategy_lib.build(strategy_lib.Choice("tpu", "test", tpu="grpc://10.0.0.2:8470", explicit=True))
    fake_tpu.resolver.assert_called_once_with(tpu="grpc://10.0.0.2:8470")
    fake_tpu.connect.assert_called_once_with(fake_tpu.resolver.return_value)
    fake_tpu.initialize.assert_called_once()


def test_tpu_already_initialized_by_tensorflow_is_not_reinitialized(fake_tpu):
    with mock.patch.object(strategy_lib, "_initialized_tpu_systems", return_value={"local": object()}):
        strategy_lib.build(strategy_lib.Choice("tpu", "test", tpu="local", explicit=True))
    fake_tpu.initialize.assert_not_called()
    fake_tpu.strategy.assert_called_once()


def test_explicit_tpu_failure_says_what_was_tried_and_the_fix(fake_tpu):
    fake_tpu.resolver.side_effect = ValueError("Please provide a TPU Name to connect to.")
    with mock.patch.object(strategy_lib, "tensorflow_has_tpu_support", return_value=False):
        with pytest.raises(strategy_lib.TPUConnectionError) as info:
            strategy_lib.build(strategy_lib.Choice("tpu", "$TPU_NAME='my-tpu'", tpu="my-tpu", explicit=True))
    message = str(info.value)
    assert "TPUClusterResolver(tpu='my-tpu')" in message
    assert "Please provide a TPU Name" in message
    assert "tpu='local'" in message  # the Colab / TPU VM hint
    assert "has no TPU support" in message and "tpukit[tpu]" in message


def test_local_tpu_failure_does_not_suggest_local_again(fake_tpu):
    fake_tpu.initialize.side_effect = tf.errors.NotFoundError(None, None, "TPUs not found in the cluster.")
    with mock.patch.object(strategy_lib, "tensorflow_has_tpu_support", return_value=True):
        with pytest.raises(strategy_lib.TPUConnectionError, match="TPUs not found") as info:
            strategy_lib.build(strategy_lib.Choice("tpu", "test", tpu="local", explicit=True))
    assert "use tpukit.connect(tpu='local')" not in str(info.value)


def test_auto_detected_tpu_failure_falls_back_to_cpu(fake_tpu, monkeypatch):
    fake_tpu.initialize.side_effect = tf.errors.NotFoundError(None, None, "TPUs not found in the cluster.")
    for var in ("TPU_NAME", "COLAB_TPU_ADDR", "TF_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    with mock.patch.object(strategy_lib, "_gpu_count", return_value=0):
        strategy = strategy_lib.build(strategy_lib.Choice("tpu", "TPU VM", tpu="local", explicit=False))
    assert strategy is tf.distribute.get_strategy()


def test_gpu_and_multi_worker_choices_build_the_right_strategy_classes():
    with mock.patch.object(tf.distribute, "MirroredStrategy") as mirrored:
        assert strategy_lib.build(strategy_lib.Choice("mirrored", "2 GPUs")) is mirrored.return_value
    with mock.patch.object(tf.distribute, "OneDeviceStrategy") as one:
        assert strategy_lib.build(strategy_lib.Choice("one_device", "1 GPU")) is one.return_value
        one.assert_called_once_with("/gpu:0")
    with mock.patch.object(tf.distribute, "MultiWorkerMirroredStrategy") as mwms:
        assert strategy_lib.build(strategy_lib.Choice("multi_worker", "TF_CONFIG")) is mwms.return_value


def test_describe_a_two_replica_strategy(strategy_2):
    line = strategy_lib.describe(strategy_2, "test reason")
    assert "MirroredStrategy (mirrored) with 2 replica(s)" in line
    assert "CPU:0" in line and "CPU:1" in line and "because test reason" in line


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
