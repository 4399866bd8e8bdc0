"""tpukit.doctor against faked environments: every runtime branch (env vars, device files), every version rule
(fake distribution versions), and the accelerator check with fake resolvers. Each message is checked. Only the
last tests run the real doctor, on this CPU machine, where it must say CPU and exit 0. Nothing runs on a TPU."""

import importlib.metadata
import json

import pytest

from tpukit.engines.jax import compat as jax_compat
from tpukit.engines.tensorflow import strategy
from tpukit.environment import versions
from tpukit.tools import doctor

GOOD_CPU = {
    "tensorflow": "2.21.0",
    "tensorflow-cpu": None,
    "tensorflow-tpu": None,
    "libtpu": None,
    "keras": "3.15.1",
    "jax": None,
    "jaxlib": None,
    "tensorflow-datasets": "4.9.10",
    "tensorflow-metadata": "1.17.3",
    "protobuf": "7.36.2",
}
GOOD_TPU = {
    **GOOD_CPU,
    "tensorflow": None,
    "tensorflow-tpu": "2.19.1",
    "libtpu": "0.0.10",
    "protobuf": "5.29.6",
}
PINNED = 'pip install "tensorflow-tpu==2.19.1" "libtpu==0.0.10"'


@pytest.fixture(autouse=True)
def python_3_12(monkeypatch):
    """The faked machines run Python 3.12 (Kaggle's), where tensorflow-tpu has a wheel, whatever runs the tests;
    the Python 3.13 tests say so."""
    monkeypatch.setattr(doctor, "_python", lambda: (3, 12))


def detect(env, tpu_files=(), gpu_files=(), colab=False, kaggle=False):
    return doctor.detect_runtime(
        env=env,
        tpu_device_files=list(tpu_files),
        gpu_device_files=list(gpu_files),
        colab_module=colab,
        kaggle_dir=kaggle,
    )


# ---- detect_runtime --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, kwargs, platform, accelerator, tpu",
    [
        (
            {"COLAB_RELEASE_TAG": "release-colab_2026", "COLAB_TPU_1VM": "1"},
            {},
            "colab",
            "tpu_vm",
            "local",
        ),
        (
            {"COLAB_RELEASE_TAG": "x", "COLAB_TPU_1VM": ""},
            {"gpu_files": ["/dev/nvidia0"]},
            "colab",
            "gpu",
            None,
        ),
        (
            {"COLAB_RELEASE_TAG": "x", "COLAB_TPU_ADDR": "10.1.2.3:8470"},
            {},
            "colab",
            "tpu_node",
            "grpc://10.1.2.3:8470",
        ),
        (
            {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "ISTPUVM": "1"},
            {},
            "kaggle",
            "tpu_vm",
            "local",
        ),
        ({}, {"kaggle": True}, "kaggle", "cpu", None),
        ({}, {"tpu_files": ["/dev/vfio/0"]}, "cloud_tpu_vm", "tpu_vm", "local"),
        (
            {"TPU_ACCELERATOR_TYPE": "v4-8"},
            {"tpu_files": ["/dev/accel0"]},
            "cloud_tpu_vm",
            "tpu_vm",
            "local",
        ),
        ({"TPU_NAME": "grpc://10.0.0.9:8470"}, {}, "other", "tpu_node", "grpc://10.0.0.9:8470"),
        ({"TPU_NAME": "my-node"}, {}, "other", "tpu_node", "my-node"),
        (
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "TPU_WORKER_ID": "0"},
            {},
            "gke",
            "tpu_vm",
            "local",
        ),
        ({}, {"gpu_files": ["/dev/nvidia0"]}, "other", "gpu", None),
        ({}, {}, "other", "cpu", None),
    ],
)
def test_runtime_detection(env, kwargs, platform, accelerator, tpu):
    runtime = detect(env, **kwargs)
    assert (runtime.platform, runtime.accelerator, runtime.tpu) == (platform, accelerator, tpu)
    assert runtime.evidence  # every decision says why


def test_pod_slice_from_worker_hostnames_needs_the_slice_name():
    env = {
        "TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5",
        "TPU_WORKER_ID": "2",
        "TPU_ACCELERATOR_TYPE": "v4-32",
    }
    runtime = detect(env, tpu_files=["/dev/accel0"])
    assert (runtime.pod_slice, runtime.hosts, runtime.worker_id, runtime.tpu) == (
        True,
        4,
        "2",
        None,
    )
    assert "pod slice: 4 TPU hosts" in "; ".join(runtime.evidence)
    _, findings = doctor.check_accelerator(runtime, connect=pytest.fail)
    assert findings[0].level == "fail" and "pod slice of 4 TPU hosts" in findings[0].message
    assert "$TPU_NAME" in findings[0].fix and "tpukit[tpu,tpu-name]" in findings[0].fix
    named = detect({**env, "TPU_NAME": "my-slice"}, tpu_files=["/dev/accel0"])
    assert named.tpu == "my-slice"


def test_pod_slice_from_host_bounds_and_single_host_bounds():
    assert detect({"TPU_HOST_BOUNDS": "1,1,2", "TPU_WORKER_ID": "0"}).hosts == 2
    assert detect({"TPU_HOST_BOUNDS": "1,1,1", "TPU_WORKER_ID": "0"}).pod_slice is False
    assert detect({"TPU_HOST_BOUNDS": "garbage"}).hosts == 1


# ---- check_versions ----------------------------------------------------------------------------------------------


def by_topic(findings, topic):
    return [f for f in findings if f.topic == topic]


def test_good_cpu_and_good_tpu_environments_pass():
    for runtime, installed in [(detect({}), GOOD_CPU), (detect({"ISTPUVM": "1"}), GOOD_TPU)]:
        findings = doctor.check_versions(runtime, installed)
        assert [f.level for f in findings] == ["ok", "ok"], findings


CLOUD_TPU_VM = {"TPU_ACCELERATOR_TYPE": "v5litepod-8", "TPU_WORKER_ID": "0"}


def test_cpu_wheel_on_a_tpu_vm_gets_the_uninstall_and_the_pinned_install():
    (finding,) = by_topic(doctor.check_versions(detect(CLOUD_TPU_VM), GOOD_CPU), "tensorflow")
    assert finding.level == "fail" and "CPU/GPU wheel (tensorflow 2.21.0)" in finding.message
    assert finding.fix.startswith("`pip uninstall -y tensorflow tensorflow-cpu` then `" + PINNED)
    assert "restart the runtime" in finding.fix


def test_cpu_wheel_on_colab_or_beside_jax_gets_the_jax_engine_not_tensorflow_tpu():
    """Colab's and Kaggle's TPU runtimes ship JAX, and tensorflow-tpu's libtpu would replace JAX's: even where
    their JAX does not find the TPU yet (Kaggle's image: jax 0.7.x with libtpu 0.0.17, not the 0.0.23 it pins),
    the fix is the jax engine's install, never tensorflow-tpu."""
    kaggle = {**GOOD_CPU, "tensorflow": None, "tensorflow-cpu": "2.20.0"}
    kaggle.update(jax="0.7.2", jaxlib="0.7.2", libtpu="0.0.17")
    cases = [
        (detect({"COLAB_TPU_1VM": "1"}), GOOD_CPU, "Colab's TPU runtime ships JAX"),
        (detect(TPU_RUNTIMES["kaggle"], kaggle=True), kaggle, "Kaggle's TPU runtime ships JAX"),
        (detect(CLOUD_TPU_VM), kaggle, "cannot share the TPU with the installed JAX"),
    ]
    for runtime, installed, why in cases:
        requires = ['libtpu==0.0.23; extra == "tpu"']
        (finding,) = by_topic(doctor.check_versions(runtime, installed, requires), "tensorflow")
        assert finding.level == "fail" and why in finding.message, finding
        assert 'pip install "jax[tpu]>=0.10,<0.13"' in finding.fix, finding
        assert "tensorflow-tpu" not in finding.fix
        # A restart only where a JAX this session may have imported is replaced.
        assert (doctor.RESTART in finding.fix) == bool(installed.get("jax")), finding.fix


def test_both_tensorflow_wheels_installed_is_a_conflict():
    installed = {**GOOD_TPU, "tensorflow": "2.21.0"}
    (finding,) = by_topic(doctor.check_versions(detect({"ISTPUVM": "1"}), installed), "tensorflow")
    assert (
        finding.level == "fail"
        and "both tensorflow-tpu 2.19.1 and the CPU/GPU wheel" in finding.message
    )
    assert (
        "pip uninstall -y tensorflow tensorflow-cpu tensorflow-tpu" in finding.fix
        and PINNED in finding.fix
    )


def test_unknown_tpu_pair_fails_with_the_pinned_install():
    installed = {**GOOD_TPU, "tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"}
    (finding,) = by_topic(doctor.check_versions(detect({"ISTPUVM": "1"}), installed), "tensorflow")
    assert finding.level == "fail"
    assert "tensorflow-tpu 2.20.0 with libtpu 0.0.52 is not a combination" in finding.message
    assert "2.19.1+libtpu 0.0.10" in finding.message
    assert finding.fix == f"`{PINNED}`, {doctor.RESTART}"


def test_known_but_unpinned_tpu_row_warns(monkeypatch):
    documented = versions.Combination(
        "tensorflow-tpu", "2.18.0", "2.18.0", ">=3.9,<3.13", False, "test row"
    )
    monkeypatch.setattr(versions, "COMBINATIONS", (*versions.COMBINATIONS, documented))
    installed = {**GOOD_TPU, "tensorflow-tpu": "2.18.0", "libtpu": "2.18.0"}
    (finding,) = by_topic(doctor.check_versions(detect({"ISTPUVM": "1"}), installed), "tensorflow")
    assert (
        finding.level == "warn"
        and "not the pinned row" in finding.message
        and PINNED in finding.message
    )


def test_google_tf_2_18_image_is_refused_with_the_pinned_install():
    installed = {**GOOD_TPU, "tensorflow-tpu": "2.18.0", "libtpu": "2.18.0"}
    (finding,) = by_topic(doctor.check_versions(detect({"ISTPUVM": "1"}), installed), "tensorflow")
    assert (
        finding.level == "fail"
        and "tensorflow-tpu 2.18.0 with libtpu 2.18.0 is not a combination" in finding.message
    )
    assert PINNED in finding.fix


def test_no_tensorflow_at_all():
    installed = {**GOOD_CPU, "tensorflow": None}
    (cpu,) = by_topic(doctor.check_versions(detect({}), installed), "tensorflow")
    assert cpu.level == "fail" and cpu.message == "TensorFlow is not installed."
    low, high = ".".join(map(str, versions.MIN_TF)), ".".join(map(str, versions.MAX_TF_EXCLUSIVE))
    assert f'pip install "tensorflow>={low},<{high}"' in cpu.fix
    (tpu,) = by_topic(doctor.check_versions(detect({"ISTPUVM": "1"}), installed), "tensorflow")
    assert PINNED in tpu.fix


@pytest.mark.parametrize(
    "version, level, words",
    [
        ("2.15.1", "fail", "outside tpukit's range"),
        ("2.22.0", "fail", "outside tpukit's range"),
        ("2.19.0", "warn", "not a tested row"),
        ("2.20.0", "ok", "a tested row"),
    ],
)
def test_cpu_tensorflow_range(version, level, words):
    (finding,) = by_topic(
        doctor.check_versions(detect({}), {**GOOD_CPU, "tensorflow": version}), "tensorflow"
    )
    assert finding.level == level and words in finding.message


def test_old_keras_fails():
    (finding,) = by_topic(
        doctor.check_versions(detect({}), {**GOOD_CPU, "keras": "2.15.0"}), "keras"
    )
    assert (
        finding.level == "fail"
        and "installed: 2.15.0" in finding.message
        and "keras>=3.15,<3.16" in finding.fix
    )


@pytest.mark.parametrize("version", ["3.12.4", "3.14.9", "3.16.0", "3.17.0"])
def test_a_keras_outside_the_tested_range_fails_with_the_install_command(version):
    (finding,) = by_topic(
        doctor.check_versions(detect({}), {**GOOD_CPU, "keras": version}), "keras"
    )
    assert finding.level == "fail" and f"installed: {version}." in finding.message
    assert finding.fix == f'`pip install "keras>=3.15,<3.16"`, {doctor.RESTART}'


def test_no_keras_at_all():
    (finding,) = by_topic(doctor.check_versions(detect({}), {**GOOD_CPU, "keras": None}), "keras")
    assert finding.level == "fail"
    assert finding.message == "Keras is not installed; tpukit needs Keras >= 3.15 and < 3.16."
    assert finding.fix == f'`pip install "keras>=3.15,<3.16"`, {doctor.RESTART}'


def test_tfds_metadata_newer_than_protobuf_fails_with_the_cap():
    installed = {**GOOD_TPU, "tensorflow-metadata": "1.21.0", "protobuf": "5.29.6"}
    (finding,) = by_topic(
        doctor.check_versions(detect({"ISTPUVM": "1"}), installed), "tensorflow-datasets"
    )
    assert (
        finding.level == "fail"
        and "tensorflow-metadata 1.21.0 needs protobuf >= 6.31" in finding.message
    )
    assert 'pip install "tensorflow-metadata<1.18"' in finding.fix


TF_2_19_REQUIRES = [  # tensorflow-tpu 2.19.1's Requires-Dist, abridged
    "protobuf!=4.21.0,<6.0.0dev,>=3.20.3",
    "numpy<2.2.0,>=1.26.0",
    'tensorflow-intel ==2.19.1 ; platform_system == "Windows"',
    "nvidia-nccl-cu12 ==2.23.4 ; extra == 'and-cuda'",
]


def test_protobuf_upgraded_past_tensorflows_bound_fails_with_the_fix():
    # What `pip install tpukit` (no extra) over a preinstalled tensorflow-tpu 2.19.1 did on this machine: pip
    # upgraded protobuf to 7.36.2 for googleapis-common-protos, past TF 2.19's <6.
    installed = {**GOOD_TPU, "protobuf": "7.36.2"}
    findings = doctor.check_versions(
        detect({"ISTPUVM": "1"}),
        installed,
        tf_requires=TF_2_19_REQUIRES,
        version_of=lambda n: installed.get(n) or {"numpy": "2.1.3"}.get(n),
    )
    (finding,) = by_topic(findings, "protobuf")
    assert finding.level == "warn"
    assert finding.message.startswith(
        "tensorflow-tpu requires protobuf!=4.21.0,<6.0.0dev,>=3.20.3 but protobuf 7.36.2"
    )
    assert (
        finding.fix.startswith('`pip install "protobuf!=4.21.0,<6.0.0dev,>=3.20.3"`')
        and "[tpu]" in finding.fix
    )
    # Markers that do not hold (Windows, the and-cuda extra) are not checked; a satisfied numpy is not reported.
    assert [f.topic for f in findings if f.level != "ok"] == ["protobuf"]


def test_requirements_within_bounds_pass():
    installed = {**GOOD_TPU, "protobuf": "5.29.6"}
    findings = doctor.check_versions(
        detect({"ISTPUVM": "1"}),
        installed,
        tf_requires=TF_2_19_REQUIRES,
        version_of=lambda n: installed.get(n),
    )
    assert [f.level for f in findings] == ["ok", "ok"]


def test_jax_whose_libtpu_was_replaced_gets_a_warning_not_a_failure():
    installed = {**GOOD_TPU, "jax": "0.7.2", "jaxlib": "0.7.2"}
    requires = ["jaxlib<=0.7.2", 'libtpu==0.0.21; extra == "tpu"', 'requests; extra == "tpu"']
    (finding,) = by_topic(
        doctor.check_versions(detect({"COLAB_TPU_1VM": "1"}), installed, requires), "jax"
    )
    assert finding.level == "warn"
    assert (
        "jax 0.7.2 expects libtpu 0.0.21 but tensorflow-tpu installed libtpu 0.0.10"
        in finding.message
    )
    assert "separate fresh runtime" in finding.message
    same = doctor.check_versions(
        detect({"COLAB_TPU_1VM": "1"}), installed, ['libtpu==0.0.10; extra == "tpu"']
    )
    assert not by_topic(same, "jax")


# ---- check_accelerator -------------------------------------------------------------------------------------------


def test_tpu_connection_reports_replicas_and_topology():
    seen = []

    def fake_connect(tpu):
        seen.append(tpu)
        topology = {"mesh_shape": [2, 2, 1, 2], "num_tasks": 1, "num_tpus_per_task": 8}
        return {"strategy": "TPUStrategyV2", "replicas": 8, "topology": topology, "hosts": 1}

    details, (finding,) = doctor.check_accelerator(
        detect({"COLAB_TPU_1VM": "1"}), connect=fake_connect
    )
    assert seen == ["local"] and details["replicas"] == 8
    assert finding.level == "ok"
    assert (
        finding.message
        == "TPUStrategyV2 with 8 replica(s), TPU mesh 2x2x1x2, 1 host(s) x 8 TPU device(s)."
    )


def test_a_failed_connection_is_explained():
    def fake_connect(tpu):
        raise strategy.TPUConnectionError("could not connect") from ValueError(
            "Please provide a TPU Name to connect to."
        )

    _, (finding,) = doctor.check_accelerator(
        detect({"TPU_NAME": "grpc://10.0.0.2:8470"}), connect=fake_connect
    )
    assert finding.level == "fail" and "TPUConnectionError: could not connect" in finding.message
    assert "tpukit.connect(tpu='local')" in finding.message


def test_expected_tpu_but_cpu_strategy_fails():
    _, (finding,) = doctor.check_accelerator(
        detect({"ISTPUVM": "1"}),
        connect=lambda tpu: {"strategy": "_DefaultDistributionStrategy", "replicas": 1},
    )
    assert finding.level == "fail" and "a TPU was expected (tpu_vm)" in finding.message


def test_explicit_tpu_argument_wins():
    seen = []
    doctor.check_accelerator(
        detect({}),
        tpu="grpc://10.9.9.9:8470",
        connect=lambda tpu: seen.append(tpu) or {"strategy": "TPUStrategyV2", "replicas": 8},
    )
    assert seen == ["grpc://10.9.9.9:8470"]


def levels(report):
    """(level, topic) of the findings about TensorFlow, Keras and the accelerator (not this machine's protobuf)."""
    mine = ("tensorflow", "tensorflow import", "keras", "accelerator")
    return [(f["level"], f["topic"]) for f in report["findings"] if f["topic"] in mine]


FAKE_MACHINE = dict(
    env={}, tpu_device_files=[], gpu_device_files=[], colab_module=False, kaggle_dir=False
)


@pytest.mark.parametrize("tensorflow", ["2.10.0", None])
def test_version_failures_skip_the_connection_and_say_so(monkeypatch, tensorflow):
    monkeypatch.setattr(
        doctor, "installed_versions", lambda: {**GOOD_CPU, "tensorflow": tensorflow}
    )
    report = doctor.diagnose_environment(
        connect=pytest.fail, import_module=pytest.fail, **FAKE_MACHINE
    )
    assert report["ok"] is False and report["accelerator"] == {}
    assert levels(report) == [
        ("fail", "tensorflow"),
        ("ok", "keras"),
        ("skip", "accelerator"),
    ]
    text = doctor.format_report(report)
    assert "[SKIP] accelerator: not checked: connecting needs a TensorFlow" in text
    assert text.endswith("NOT OK: fix the [FAIL] lines above.")


PROTOBUF_ERROR = TypeError(
    "Descriptors cannot be created directly. If this call came from a _pb2.py file, your generated code is out "
    "of date and must be regenerated with protoc >= 3.19.0."
)


def test_a_tensorflow_that_does_not_import_is_a_failure_with_the_reinstall():
    def broken(name):
        assert name == "tensorflow"
        raise PROTOBUF_ERROR

    (finding,) = doctor.check_import(GOOD_CPU, import_module=broken)
    assert finding.level == "fail" and finding.topic == "tensorflow import"
    assert finding.message.startswith(
        "tensorflow 2.21.0 is installed but `import tensorflow` failed: TypeError: Descriptors cannot"
    )
    assert finding.fix == f'`pip install "tensorflow==2.21.0" --force-reinstall`, {doctor.RESTART}'
    (tpu,) = doctor.check_import(GOOD_TPU, import_module=broken)
    assert tpu.fix == f"`{PINNED} --force-reinstall`, {doctor.RESTART}"
    assert doctor.check_import(GOOD_CPU, import_module=lambda name: object()) == []


def test_an_import_failure_skips_the_connection(monkeypatch):
    monkeypatch.setattr(doctor, "installed_versions", lambda: GOOD_CPU)

    def broken(name):
        raise ImportError("libtensorflow_framework.so.2: cannot open shared object file")

    report = doctor.diagnose_environment(connect=pytest.fail, import_module=broken, **FAKE_MACHINE)
    assert report["ok"] is False and report["accelerator"] == {}
    assert levels(report) == [
        ("ok", "tensorflow"),
        ("ok", "keras"),
        ("fail", "tensorflow import"),
        ("skip", "accelerator"),
    ]
    assert "ImportError: libtensorflow_framework.so.2" in report["findings"][-2]["message"]


def test_only_keras_out_of_range_still_connects(monkeypatch):
    monkeypatch.setattr(doctor, "installed_versions", lambda: {**GOOD_CPU, "keras": "3.17.0"})
    report = doctor.diagnose_environment(
        connect=lambda tpu: {"strategy": "_DefaultDistributionStrategy", "replicas": 1},
        import_module=lambda name: object(),
        **FAKE_MACHINE,
    )
    assert report["ok"] is False and report["accelerator"]["replicas"] == 1
    assert levels(report) == [
        ("ok", "tensorflow"),
        ("fail", "keras"),
        ("ok", "accelerator"),
    ]


# ---- the real thing, on this CPU machine --------------------------------------------------------------------------


def test_main_on_this_cpu_machine_says_cpu_and_exits_0(capsys, monkeypatch):
    for var in (
        "TPU_NAME",
        "COLAB_TPU_ADDR",
        "TF_CONFIG",
        "TPU_ACCELERATOR_TYPE",
        "TPU_WORKER_ID",
        "ISTPUVM",
        "COLAB_TPU_1VM",
        "TPU_WORKER_HOSTNAMES",
    ):
        monkeypatch.delenv(var, raising=False)
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert (
        "accelerator: CPU" in out
        and "[OK  ] accelerator: _DefaultDistributionStrategy with 1 replica(s)." in out
    )
    assert out.rstrip().endswith("OK: this environment can train.")
    assert doctor.main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["runtime"]["accelerator"] == "cpu"
    assert report["accelerator"]["replicas"] == 1 and report["accelerator"]["tpu_build"] is False
    # Whatever KERAS_BACKEND says: the CLI sets the backend from the recipe's engine. (The jax engine's line depends
    # on whether this machine has JAX: the tests of check_engines fake both cases.)
    assert report["engines"]["tensorflow"] == {"can_run": True, "reason": None}
    assert [f["topic"] for f in report["findings"]][-2:] == ["tensorflow engine", "jax engine"]


def test_on_a_tpu_vm_a_failing_tpu_name_falls_back_to_the_attached_tpu():
    seen = []

    def fake_connect(tpu):
        seen.append(tpu)
        if tpu != "local":
            raise strategy.TPUConnectionError("could not connect") from ValueError(
                "Please provide a TPU Name to connect to."
            )
        return {"strategy": "TPUStrategyV2", "replicas": 8}

    details, findings = doctor.check_accelerator(
        detect({"ISTPUVM": "1", "TPU_NAME": "old-node"}), connect=fake_connect
    )
    assert seen == ["old-node", "local"] and details["replicas"] == 8
    assert [f.level for f in findings] == ["warn", "ok"]
    assert "tpu='old-node' failed" in findings[0].message and "--tpu local" in findings[0].fix


def test_when_every_way_fails_each_attempt_is_reported():
    def fake_connect(tpu):
        raise RuntimeError(f"no TPU at {tpu}")

    _, (finding,) = doctor.check_accelerator(
        detect({"ISTPUVM": "1", "TPU_NAME": "old-node"}), connect=fake_connect
    )
    assert finding.level == "fail"
    assert "tpu='old-node' failed" in finding.message and "tpu='local' failed" in finding.message


# ---- engines: which can run here, and the jax engine on TPU runtimes that ship JAX ----------------------------------

# jax 0.10.2's Requires-Dist, abridged: its `tpu` extra pins jaxlib and the libtpu JAX was built with.
JAX_REQUIRES = [
    "jaxlib<=0.10.2,>=0.10.1",
    "numpy>=2.0",
    'jaxlib<=0.10.2,>=0.10.2; extra == "tpu"',
    'libtpu==0.0.42.*; extra == "tpu"',
]
# Colab's TPU runtime as it ships since March 2025: JAX with its libtpu, no TensorFlow at all
# (github.com/googlecolab/colabtools/issues/5164); pip installs tpukit's own requirements (Keras, TFDS) beside it.
TPU_JAX = {
    **GOOD_CPU,
    "tensorflow": None,
    "jax": "0.10.2",
    "jaxlib": "0.10.2",
    "libtpu": "0.0.42.1",
}
TPU_RUNTIMES = {
    "colab": {"COLAB_RELEASE_TAG": "release-colab_2026", "COLAB_TPU_1VM": "1"},
    "kaggle": {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "ISTPUVM": "1"},
}
ADD_TENSORFLOW_CPU = '`pip install "tensorflow-cpu>=2.19,<2.22"`'
TRAIN_WITH_JAX = (
    "train with the jax engine: `python -m tpukit.train RECIPE --set runtime.engine=jax`"
)


@pytest.fixture
def metadata(monkeypatch):
    """`fake(installed)` makes package metadata say `installed` (what installed_versions and the jax engine's own
    `installed_jax` read), with jax's Requires-Dist `JAX_REQUIRES`."""

    def fake(installed):
        def version(name):
            if installed.get(name) is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return installed[name]

        monkeypatch.setattr(importlib.metadata, "version", version)
        monkeypatch.setattr(
            importlib.metadata, "requires", lambda name: JAX_REQUIRES if name == "jax" else []
        )
        monkeypatch.delenv(jax_compat.ALLOW_UNTESTED_JAX, raising=False)

    return fake


def engines(runtime, installed, requires=JAX_REQUIRES):
    """check_engines on the version findings of `installed` (TensorFlow imports, where it is checked)."""
    return doctor.check_engines(
        runtime, installed, doctor.check_versions(runtime, installed, requires), requires
    )


@pytest.mark.parametrize(
    "pin, version, matches",
    [
        ("0.0.42.*", "0.0.42.1", True),
        ("0.0.42.*", "0.0.42", True),
        ("0.0.42.*", "0.0.421", False),
        ("0.0.42.*", "0.0.10", False),
        ("0.0.21", "0.0.21", True),
        ("0.0.21", "0.0.21.1", False),
    ],
)
def test_libtpu_against_the_pin_of_jaxs_tpu_extra(pin, version, matches):
    assert doctor._libtpu_matches(pin, version) is matches


@pytest.mark.parametrize("platform", sorted(TPU_RUNTIMES))
def test_a_tpu_runtime_with_jax_and_no_tensorflow_gets_the_jax_engine_not_tensorflow_tpu(platform):
    runtime = detect(TPU_RUNTIMES[platform], kaggle=platform == "kaggle")
    assert (runtime.platform, runtime.accelerator) == (platform, "tpu_vm")
    (finding,) = by_topic(doctor.check_versions(runtime, TPU_JAX, JAX_REQUIRES), "tensorflow")
    assert finding.level == "fail"
    assert finding.message.startswith(
        "TensorFlow is not installed. This TPU runtime's JAX finds the TPU (jax 0.10.2, libtpu 0.0.42.1): the jax "
        "engine trains on it with TensorFlow's CPU build for tf.data, keeping that libtpu."
    )
    # Only tf.data's CPU build is added: no tensorflow-tpu, no libtpu replaced, no restart.
    assert finding.fix == (
        f"{ADD_TENSORFLOW_CPU}, JAX and its libtpu stay (restart only if pip upgraded a package this session had imported); then {TRAIN_WITH_JAX}"
    )
    assert "tensorflow-tpu" not in finding.fix and doctor.RESTART not in finding.fix


@pytest.mark.parametrize(
    "change",
    [{"libtpu": None}, {"libtpu": "0.0.21"}, {"jax": None, "jaxlib": None, "libtpu": None}],
    ids=["jax_without_libtpu", "another_libtpu", "no_jax"],
)
def test_without_a_jax_that_finds_the_tpu_the_advice_is_the_jax_engine_on_colab(change):
    installed = {**TPU_JAX, **change}
    (finding,) = by_topic(
        doctor.check_versions(detect(TPU_RUNTIMES["colab"]), installed, JAX_REQUIRES), "tensorflow"
    )
    assert finding.message.startswith(
        "TensorFlow is not installed. This TPU VM trains with the jax engine"
    )
    assert 'pip install "jax[tpu]>=0.10,<0.13"' in finding.fix and PINNED not in finding.fix


def test_a_cloud_tpu_vm_without_jax_or_tensorflow_gets_the_pinned_tensorflow_tpu():
    installed = {**TPU_JAX, "jax": None, "jaxlib": None, "libtpu": None}
    (finding,) = by_topic(
        doctor.check_versions(detect(CLOUD_TPU_VM), installed, JAX_REQUIRES), "tensorflow"
    )
    assert finding.message == "TensorFlow is not installed." and PINNED in finding.fix


def test_a_tpu_runtimes_jax_outside_the_range_is_upgraded_with_its_libtpu_and_a_restart():
    installed = {**TPU_JAX, "jax": "0.7.2", "jaxlib": "0.7.2", "libtpu": "0.0.21"}
    requires = ['libtpu==0.0.21; extra == "tpu"']
    (finding,) = by_topic(
        doctor.check_versions(detect(TPU_RUNTIMES["colab"]), installed, requires), "tensorflow"
    )
    assert finding.fix == (
        f'`pip install "jax[tpu]>=0.10,<0.13" "tensorflow-cpu>=2.19,<2.22"`, {doctor.RESTART}; then {TRAIN_WITH_JAX}'
    )


def test_a_tpu_runtime_with_jax_and_tensorflows_cpu_build_trains_with_the_jax_engine(metadata):
    # After `pip install "tpukit[jax-tpu]"` on Colab: the doctor says OK, does not connect through TensorFlow's CPU
    # build, and names the engine to use.
    installed = {**TPU_JAX, "tensorflow-cpu": "2.21.0"}
    metadata(installed)
    report = doctor.diagnose_environment(
        connect=pytest.fail,
        import_module=lambda name: object(),
        **{**FAKE_MACHINE, "env": TPU_RUNTIMES["colab"]},
    )
    assert [(f["level"], f["topic"]) for f in report["findings"]] == [
        ("warn", "tensorflow"),
        ("ok", "keras"),
        ("skip", "accelerator"),
        ("ok", "tpu compiler"),  # jax's libtpu compiles for TPUs (tpukit check --topology)
        ("skip", "tensorflow engine"),
        ("ok", "jax engine"),
    ]
    assert report["ok"] is True and report["accelerator"] == {}
    tensorflow = report["findings"][0]
    assert tensorflow["message"].startswith(
        "this TPU VM's TensorFlow is the CPU/GPU wheel (tensorflow 2.21.0), which has no TPU kernels: the "
        "tensorflow engine cannot use the TPU. This TPU runtime's JAX finds the TPU"
    )
    assert tensorflow["fix"] == TRAIN_WITH_JAX
    assert report["engines"] == {
        "tensorflow": {
            "can_run": False,
            "reason": "on a TPU VM it needs TensorFlow's TPU build (tensorflow-tpu); the CPU/GPU wheel has no TPU "
            "kernels.",
        },
        "jax": {"can_run": True, "reason": None},
    }
    text = doctor.format_report(report)
    assert (
        "[OK  ] jax engine: can run: `--set runtime.engine=jax` (runtime.engine: jax); jax 0.10.2, tf.data on "
        "tensorflow 2.21.0." in text
    )
    assert "tensorflow-tpu==" not in text and text.endswith("OK: this environment can train.")


def test_a_fresh_tpu_runtime_says_what_the_jax_engine_lacks(metadata):
    metadata(TPU_JAX)
    report = doctor.diagnose_environment(
        connect=pytest.fail,
        import_module=pytest.fail,
        **{**FAKE_MACHINE, "env": TPU_RUNTIMES["kaggle"]},
    )
    assert report["ok"] is False
    assert [(f["level"], f["topic"]) for f in report["findings"]][-4:] == [
        ("skip", "accelerator"),
        (
            "skip",
            "tpu compiler",
        ),  # libtpu is here, but the jax engine that builds the step cannot run
        ("fail", "tensorflow engine"),
        ("fail", "jax engine"),
    ]
    assert report["engines"]["jax"]["reason"] == (
        f"tf.data reads the input and needs TensorFlow's CPU build, which is not installed. Fix: {ADD_TENSORFLOW_CPU}."
    )
    assert "tensorflow-tpu==" not in doctor.format_report(report)


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_both_engines_can_run_whatever_keras_backend_is_set(metadata, monkeypatch, backend):
    monkeypatch.setenv("KERAS_BACKEND", backend)
    for installed in (
        {**GOOD_CPU, "jax": "0.10.2"},
        {**GOOD_CPU, "tensorflow": None, "tensorflow-cpu": "2.21.0", "jax": "0.12.0"},
    ):
        metadata(installed)
        assert engines(detect({}), installed) == {"tensorflow": None, "jax": None}


@pytest.mark.parametrize(
    "change, tensorflow, jax",
    [
        ({}, None, "tpukit's jax engine needs JAX. Fix: `pip install \"tpukit[jax] @ git+"),
        (
            {"jax": "0.9.2"},
            None,
            "tpukit's jax engine was tested with jax >= 0.10 and < 0.13; received jax 0.9.2.",
        ),
        (
            {"jax": "0.13.0"},
            None,
            "tpukit's jax engine was tested with jax >= 0.10 and < 0.13; received jax 0.13.0.",
        ),
        (
            {"jax": "0.10.2", "tensorflow": "2.10.0"},
            "tensorflow 2.10.0 is outside tpukit's range [2.19, 2.22).",
            "tf.data reads the input with TensorFlow >=2.19,<2.22; installed: tensorflow 2.10.0. Fix: "
            '`pip install "tensorflow>=2.19,<2.22"`',
        ),
        (
            {"jax": "0.10.2", "tensorflow": None},
            "TensorFlow is not installed.",
            f"tf.data reads the input and needs TensorFlow's CPU build, which is not installed. Fix: {ADD_TENSORFLOW_CPU}.",
        ),
        (
            {"jax": "0.10.2", "keras": "3.17.0"},
            "tpukit was tested with Keras >= 3.15 and < 3.16",
            "tpukit was tested with Keras >= 3.15 and < 3.16",
        ),
    ],
    ids=["no_jax", "old_jax", "new_jax", "old_tensorflow", "no_tensorflow", "keras"],
)
def test_each_engine_says_why_it_cannot_run(metadata, change, tensorflow, jax):
    installed = {**GOOD_CPU, **change}
    metadata(installed)
    problems = engines(detect({}), installed)
    for name, expected in (("tensorflow", tensorflow), ("jax", jax)):
        assert (
            (problems[name] is None) if expected is None else problems[name].startswith(expected)
        ), (
            name,
            problems[name],
        )
    lines = {f.topic: f for f in doctor.engine_findings(problems, installed)}
    level = "skip" if None in problems.values() else "fail"
    for name, problem in problems.items():
        assert lines[f"{name} engine"].level == ("ok" if problem is None else level)


def test_jax_cannot_share_a_tpu_with_tensorflow_tpu(metadata):
    installed = {**GOOD_TPU, "jax": "0.10.2", "jaxlib": "0.10.2"}
    metadata(installed)
    problems = engines(detect(TPU_RUNTIMES["kaggle"], kaggle=True), installed)
    assert problems["tensorflow"] is None
    assert problems["jax"].startswith(
        "tensorflow-tpu 2.19.1 is installed: TensorFlow's TPU build and JAX cannot share one TPU, and it brought "
        "the libtpu TensorFlow needs (0.0.10)."
    )
    assert [f.level for f in doctor.engine_findings(problems, installed)] == ["ok", "skip"]


def test_jax_on_a_tpu_vm_needs_the_libtpu_its_tpu_extra_pins(metadata):
    installed = {**TPU_JAX, "tensorflow-cpu": "2.21.0", "libtpu": None}
    metadata(installed)
    problems = engines(detect({"ISTPUVM": "1"}), installed)
    assert problems["jax"] == (
        "JAX would not find the TPU: jax 0.10.2 needs the libtpu its `tpu` extra pins (0.0.42.*); installed: none. "
        f'Fix: `pip install "jax[tpu]>=0.10,<0.13"`, {doctor.RESTART}.'
    )


JAX_TPU_REQUIRES = ['libtpu==0.0.42.*; extra == "tpu"', "jaxlib<=0.10.2,>=0.10.2"]


@pytest.mark.parametrize(
    "installed, level, words",
    [
        ({"jax": "0.10.2", "libtpu": "0.0.42.1"}, "ok", "libtpu 0.0.42.1 with jax 0.10.2"),
        ({"jax": "0.10.2", "libtpu": None}, "skip", "libtpu not installed"),
        ({"jax": None, "libtpu": None}, "skip", "jax and libtpu not installed"),
        ({"jax": "0.10.2", "libtpu": "0.0.10"}, "warn", "the libtpu 0.0.42.* it pins"),
        ({"jax": "0.4.30", "libtpu": "0.0.42.1"}, "warn", "jax in the jax engine's range"),
    ],
)
def test_the_doctor_says_whether_tpu_compilation_is_available(installed, level, words):
    (finding,) = doctor.check_tpu_compiler(installed, JAX_TPU_REQUIRES)
    assert (finding.level, finding.topic) == (level, "tpu compiler")
    assert words in finding.message
    assert (finding.fix is None) == (level == "ok")
    assert level == "ok" or "tpukit[tpu-check]" in finding.fix


def test_tpu_compilation_needs_the_jax_engine_to_run():
    installed = {"jax": "0.10.2", "libtpu": "0.0.42.1"}
    (finding,) = doctor.check_tpu_compiler(
        installed, JAX_TPU_REQUIRES, "TensorFlow is not installed."
    )
    assert finding.level == "skip" and "cannot run here" in finding.message


@pytest.mark.parametrize(
    "platform, jax, libtpu, effect",
    [
        ("colab", "0.10.2", "0.0.42.1", "keeps this runtime's jax 0.10.2 and libtpu 0.0.42.1"),
        # A JAX in range without the libtpu it pins does not find the TPU: jax[tpu] installs that libtpu.
        ("colab", "0.10.2", None, "replaces this runtime's jax 0.10.2 and libtpu none"),
        # Kaggle's image: jax[tpu] unpinned at build time (0.7.2 then), libtpu forced to 0.0.17 (its tpu/Dockerfile).
        (
            "kaggle",
            "0.7.2",
            "0.0.17",
            "replaces this runtime's jax 0.7.2 and libtpu 0.0.17 with jax[tpu] >=0.10,<0.13 and the libtpu it pins",
        ),
    ],
)
def test_colab_and_kaggle_tpu_runtimes_are_named_with_the_engine_and_the_install_command(
    metadata, platform, jax, libtpu, effect
):
    installed = {**TPU_JAX, "jax": jax, "jaxlib": jax, "libtpu": libtpu, "tensorflow-cpu": "2.20.0"}
    metadata(installed)
    report = doctor.diagnose_environment(
        connect=pytest.fail,
        import_module=lambda name: object(),
        **{**FAKE_MACHINE, "env": TPU_RUNTIMES[platform], "kaggle_dir": platform == "kaggle"},
    )
    hosted = report["hosted"]
    assert hosted["name"] == versions.HOSTED_RUNTIMES[platform].name
    assert hosted["engine"] == "jax" and hosted["install"] == (
        'pip install "tpukit[jax-tpu] @ git+https://github.com/tpukit/tpukit.git"'
    )
    assert hosted["install_effect"].startswith(effect)
    text = doctor.format_report(report)
    chips = {"colab": "TPU v5e-1 (one chip, 16 GB HBM)", "kaggle": "TPU v5e-8 (8 chips)"}[platform]
    assert f"  {hosted['name']}: {chips}; ships " in text
    assert (
        "tpukit trains here with the jax engine (`python -m tpukit.train RECIPE --set runtime.engine=jax`)"
        in text
    )
    assert f"  install: `{hosted['install']}` ({effect}" in text
    assert json.loads(json.dumps(report))["hosted"] == hosted


@pytest.mark.parametrize(
    "env, kaggle, gpu",
    [
        ({"COLAB_RELEASE_TAG": "release-colab_2026"}, False, []),  # Colab's CPU runtime
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, True, ["/dev/nvidia0"]),  # Kaggle's GPU runtime
        (
            {"TPU_ACCELERATOR_TYPE": "v5litepod-8", "TPU_WORKER_ID": "0"},
            False,
            [],
        ),  # a Cloud TPU VM
    ],
)
def test_other_runtimes_are_not_named(env, kaggle, gpu):
    runtime = detect(env, gpu_files=gpu, kaggle=kaggle)
    assert doctor.hosted_runtime(runtime, TPU_JAX) is None


def test_on_python_3_13_a_tpu_vm_is_sent_to_the_jax_engine_not_to_tensorflow_tpu(monkeypatch):
    monkeypatch.setattr(doctor, "_python", lambda: (3, 13))
    runtime = detect(TPU_RUNTIMES["colab"])
    no_jax = {**TPU_JAX, "jax": None, "jaxlib": None, "libtpu": None}
    for where in (runtime, detect(CLOUD_TPU_VM)):
        (finding,) = by_topic(doctor.check_versions(where, no_jax, None), "tensorflow")
        assert finding.message.startswith(
            "TensorFlow is not installed. This TPU VM trains with the jax engine (no TensorFlow TPU build "
            "installs on Python 3.13); JAX is not installed."
        )
        assert 'pip install "jax[tpu]>=0.10,<0.13"' in finding.fix and PINNED not in finding.fix
    cpu_wheel = {**no_jax, "tensorflow": "2.21.0"}
    (finding,) = by_topic(doctor.check_versions(runtime, cpu_wheel, None), "tensorflow")
    assert "no TensorFlow TPU build installs on Python 3.13" in finding.message
    assert "tensorflow-tpu" not in finding.fix
    problems = engines(runtime, {**TPU_JAX, "tensorflow-cpu": "2.21.0"})
    assert "no TensorFlow TPU build installs on Python 3.13" in problems["tensorflow"]
    assert problems["jax"] is None


def test_on_kaggles_image_the_jax_engine_line_asks_for_jaxs_tpu_build_like_the_tensorflow_line(
    metadata,
):
    """Kaggle's image has jax 0.7.x: the fix is JAX's TPU build in range (with the libtpu it pins), as the
    tensorflow line says, not a CPU JAX or TPUKIT_ALLOW_UNTESTED_JAX."""
    installed = {**GOOD_CPU, "tensorflow": None, "tensorflow-cpu": "2.20.0"}
    installed.update(jax="0.7.2", jaxlib="0.7.2", libtpu="0.0.17")
    metadata(installed)
    runtime = detect(TPU_RUNTIMES["kaggle"], kaggle=True)
    problems = engines(runtime, installed, ['libtpu==0.0.23; extra == "tpu"'])
    assert problems["jax"].startswith("jax 0.7.2 is outside the range the jax engine was tested in")
    assert (
        'pip install "jax[tpu]>=0.10,<0.13"' in problems["jax"]
        and doctor.RESTART in problems["jax"]
    )
    assert "ALLOW_UNTESTED" not in problems["jax"]
    no_jax = {**installed, "jax": None, "jaxlib": None, "libtpu": None}
    metadata(no_jax)
    assert engines(runtime, no_jax, None)["jax"] == (
        f'JAX is not installed. Fix: `pip install "{versions.tpukit_requirement("jax-tpu")}"`.'
    )
