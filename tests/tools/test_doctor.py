"""tpukit.doctor against faked environments: every runtime branch (env vars, device files), every version rule
(fake distribution versions), and the accelerator check with fake resolvers. Each message is checked. Only the
last tests run the real doctor, on this CPU machine, where it must say CPU and exit 0. Nothing runs on a TPU."""

import json

import pytest

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


def test_cpu_wheel_on_a_tpu_vm_gets_the_uninstall_and_the_pinned_install():
    (finding,) = by_topic(
        doctor.check_versions(detect({"COLAB_TPU_1VM": "1"}), GOOD_CPU), "tensorflow"
    )
    assert finding.level == "fail" and "CPU/GPU wheel (tensorflow 2.21.0)" in finding.message
    assert finding.fix.startswith("`pip uninstall -y tensorflow tensorflow-cpu` then `" + PINNED)
    assert "restart the runtime" in finding.fix


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
