"""tpukit.environment.diagnose: each known environmental error, as TensorFlow/JAX print it (texts copied from the cited public
reports), maps to its cause and fix; unrelated errors map to nothing. No TPU is involved: these are text matches."""

import resource

import pytest

from tpukit.environment import diagnose, versions

# (error text as reported upstream, known error name, words the explanation must contain)
REPORTED = [
    (
        "InvalidArgumentError: No OpKernel was registered to support Op 'ConfigureDistributedTPU' used by "
        '{{node ConfigureDistributedTPU}} with these attrs: [tpu_embedding_config="", is_global_init=false]\n'
        "Registered devices: [CPU]\nRegistered kernels:\n  <no registered kernels>",
        "cpu_tensorflow_on_tpu",
        [
            "CPU/GPU wheel",
            "pip uninstall -y tensorflow",
            'tensorflow-tpu==2.19.1" "libtpu==0.0.10"',
            "restart the runtime",
        ],
    ),
    (
        "ValueError: Please provide a TPU Name to connect to.",
        "tpu_name_required",
        ["tpukit.connect(tpu='local')", "--tpu=local", "TPUClusterResolver(tpu='local')"],
    ),
    (
        "NotFoundError: could not find registered transfer manager for platform Host -- check target linkage\n"
        "[[{{node StatefulPartitionedCall}}]] [Op:__inference_multi_step_on_iterator_33145]",
        "xla_function_on_host",
        ["XLA:CPU", "strategy.scope()", "jit_compile=False"],
    ),
    (
        "UnimplementedError: File system scheme '[local]' not implemented (file: '/content/data/train.tfrecord')",
        "local_files_on_remote_tpu",
        ["gs://", "cannot see this machine's disk"],
    ),
    (
        "ResourceExhaustedError: Compilation failure: Ran out of memory in memory space hbm. Used 8.38G of 8.00G "
        "hbm. Exceeded hbm capacity by 385.25M.",
        "hbm_out_of_memory",
        ["needs 8.38G of the 8.00G HBM", "global_batch_size", "mixed_bfloat16"],
    ),
    (
        # The TPU runtime's form (an execution, not the compilation): pytorch/xla#1735
        "RuntimeError: Resource exhausted: From /job:tpu_worker/replica:0/task:0:\nAttempting to reserve 3.95G at "
        "the bottom of memory. That was not possible. There are 1.92G free, 0B reserved, and 1.92G reservable.",
        "hbm_out_of_memory",
        ["high-bandwidth memory (HBM)", "global_batch_size"],
    ),
    (
        # Measured here: `ulimit -v 8000000; python -m tpukit.train digits_cnn --set model.dense_units=200000000`
        # (TF 2.21, oneDNN's allocator), raised while Keras builds the Dense kernel.
        "ResourceExhaustedError: {{function_node __wrapped__StatelessRandomUniformV2_device_/job:localhost/replica:0/"
        "task:0/device:CPU:0}} OOM when allocating tensor with shape[256,200000000] and type float on "
        "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu [Op:StatelessRandomUniformV2] name: ",
        "host_out_of_memory",
        [
            "out of host memory",
            "not an accelerator's",
            "[256, 200000000] (190.73 GiB)",
            "global_batch_size",
        ],
    ),
    (
        "ResourceExhaustedError: OOM when allocating tensor with shape[16,19,19,1024] and type float on "
        "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
        "host_out_of_memory",
        ["float32 tensor of shape [16, 19, 19, 1024] (22.6 MiB)", "ulimit -v"],
    ),
    (
        "ResourceExhaustedError: OOM when allocating tensor with shape[64,372,32,32] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "gpu_out_of_memory",
        [
            "out of GPU memory",
            "on GPU 0: a float32 tensor of shape [64, 372, 32, 32] (93.0 MiB)",
            "nvidia-smi",
        ],
    ),
    (
        "UserWarning: cloud_tpu_init failed: AttributeError(\"module 'libtpu' has no attribute 'get_library_path'\")"
        "\n This a JAX bug; please report an issue",
        "tensorflow_libtpu_breaks_jax",
        ["preinstalled JAX", "jax[tpu]", "still trains on the TPU"],
    ),
    (
        "WARNING:jax._src.xla_bridge:A Google TPU may be present on this machine, but either a TPU-enabled jaxlib "
        "or libtpu is not installed. Falling back to cpu.",
        "tensorflow_libtpu_breaks_jax",
        ["separate fresh runtime"],
    ),
    (
        "RuntimeError: Missing runtime dependency on the Google API client. Run `pip install cloud-tpu-client` to fix.",
        "tpu_api_client_missing",
        ["google-api-python-client oauth2client", "tpukit[tpu,tpu-name]"],
    ),
    (
        # googlecolab/colabtools#5203: tensorflow_cpu on Colab's TPU runtime (TPUStrategy's initialization).
        "NotFoundError: TPUs not found in the cluster. Failed in initialization: No OpKernel was registered",
        "cpu_tensorflow_on_tpu",
        [
            'pip install "tpukit[jax-tpu] @ git+https://github.com/tpukit/tpukit.git"',
            "--set runtime.engine=jax",
            "Python 3.13",
        ],
    ),
    (
        # jax-ml/jax#35905: jax.distributed.initialize() on a v6e-16 multislice, JAX 0.8.1+.
        "jaxlib._jax.XlaRuntimeError: DEADLINE_EXCEEDED: Deadline Exceeded\n\n"
        "RPC: /tensorflow.CoordinationService/RegisterTask",
        "jax_coordinator_port",
        ["8482", "JAX_COORDINATOR_PORT=8476", "every host"],
    ),
    (
        # keras-team/keras-hub#2479 (jax/_src/core.py, JAX 0.8+).
        "ValueError: Triggering __jax_array__() during abstractification is no longer supported. To avoid this "
        "error, either explicitly convert your object using jax.numpy.array(), or register your object as a pytree.",
        "jax_array_abstractification",
        [
            'pip install "keras>=3.15,<3.16" "keras-hub>=0.32"',
            "jax.numpy.asarray",
            "keras-hub#2479",
        ],
    ),
    (
        # TensorBoard's Profile tab on Colab with tensorboard-plugin-profile (openxla/xprof#839).
        "No profile data was found.",
        "profile_plugin_on_colab",
        ["pip install -U xprof", "runtime.profile_steps"],
    ),
    (
        # Measured here: the chief's error ~10 s after the other worker of a 2-worker cluster was SIGKILLed.
        "InternalError: Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are "
        "unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed.",
        "worker_lost",
        ["another worker", "start the same command on every worker again"],
    ),
]


@pytest.mark.parametrize(
    "text, name, words", REPORTED, ids=[r[1] + str(i) for i, r in enumerate(REPORTED)]
)
def test_each_reported_error_gets_its_cause_and_fix(text, name, words):
    assert diagnose.match(text).name == name
    explanation = diagnose.explain(text)
    assert (
        explanation.startswith("Cause: ")
        and " Fix: " in explanation
        and "Reported in: github.com/" in explanation
    )
    for word in words:
        assert word in explanation, (word, explanation)


def test_every_known_error_is_exercised_and_cites_public_reports():
    assert {name for _, name, _ in REPORTED} == {known.name for known in diagnose.KNOWN_ERRORS}
    for known in diagnose.KNOWN_ERRORS:
        assert known.reports and all(report.startswith("github.com/") for report in known.reports)


def test_the_install_fix_is_the_pinned_row_of_the_version_table():
    pinned = versions.pinned_tpu()
    assert pinned.install_command() in diagnose.explain(
        "No OpKernel was registered to support Op 'TPUCompile'"
    )


def test_exceptions_are_matched_through_their_cause_chain():
    try:
        try:
            raise ValueError("Please provide a TPU Name to connect to.")
        except ValueError as inner:
            raise RuntimeError("connecting failed") from inner
    except RuntimeError as outer:
        assert diagnose.match(outer).name == "tpu_name_required"


def test_hbm_numbers_are_optional():
    explanation = diagnose.explain("Ran out of memory in memory space hbm.")
    assert "needs" not in explanation and "global_batch_size" in explanation


MEMINFO = "MemTotal:       16315612 kB\nMemFree:         1000000 kB\nMemAvailable:    8157806 kB\n"
CPU_OOM = (
    "OOM when allocating tensor with shape[256,200000000] and type float on "
    "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu"
)


def test_host_memory_reads_meminfo_and_the_address_space_limit():
    memory = diagnose.host_memory(MEMINFO, 8_000_000 * 1024)
    assert memory == diagnose.HostMemory(16315612 * 1024, 8157806 * 1024, 8_000_000 * 1024)
    assert diagnose.host_memory("", None) == diagnose.HostMemory()
    assert diagnose.host_memory(MEMINFO, resource.RLIM_INFINITY).address_space_limit is None
    real = (
        diagnose.host_memory()
    )  # this machine: Linux has both, and no limit unless the test runs under one
    assert real.total and real.available and real.total >= real.available
    assert real.address_space_limit == (
        None
        if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY
        else resource.getrlimit(resource.RLIMIT_AS)[0]
    )


def test_host_oom_gives_the_tensor_the_machine_and_the_limit(monkeypatch):
    faked = diagnose.host_memory(MEMINFO, 8_000_000 * 1024)  # 16 GB of RAM, `ulimit -v 8000000`
    monkeypatch.setattr(diagnose, "host_memory", lambda: faked)
    explanation = diagnose.explain(CPU_OOM)
    assert explanation.startswith("Cause: the run ran out of host memory: this machine's RAM")
    assert (
        "The allocation refused: a float32 tensor of shape [256, 200000000] (190.73 GiB); this machine's RAM: "
        "15.56 GiB (7.78 GiB available now); this process's address-space limit (`ulimit -v`): 7.63 GiB"
    ) in explanation
    fix = explanation.split(" Fix: ")[1]
    for words in (
        "data.global_batch_size",
        "model smaller",
        "more memory",
        "`ulimit -v`",
        "raise it",
    ):
        assert words in fix, (words, fix)


def test_host_oom_without_numbers_still_explains(monkeypatch):
    monkeypatch.setattr(diagnose, "host_memory", lambda: diagnose.HostMemory())
    for error in (MemoryError(), MemoryError("out of memory")):
        explanation = diagnose.explain(error)
        assert (
            explanation.startswith("Cause: the run ran out of host memory")
            and " Fix: lower" in explanation
        )
        assert "allocation refused" not in explanation and "RAM:" not in explanation


def test_numpy_memory_errors_are_host_memory(monkeypatch):
    monkeypatch.setattr(diagnose, "host_memory", lambda: diagnose.HostMemory(2**34))
    text = (
        "_ArrayMemoryError: Unable to allocate 5.00 GiB for an array with shape (256, 5000000) and data type "
        "float32"
    )
    explanation = diagnose.explain(text)
    assert diagnose.match(text).name == "host_out_of_memory"
    assert (
        "a float32 tensor of shape [256, 5000000] (4.77 GiB); this machine's RAM: 16.00 GiB."
        in explanation
    )


@pytest.mark.parametrize(
    "text, name",
    [
        (CPU_OOM, "host_out_of_memory"),
        (
            CPU_OOM.replace(
                "device:CPU:0 by allocator mklcpu", "device:GPU:1 by allocator GPU_1_bfc"
            ),
            "gpu_out_of_memory",
        ),
        ("Ran out of memory in memory space hbm. Used 17.2G of 15.48G hbm.", "hbm_out_of_memory"),
        # A TPU's OOM whose function name mentions the host's CPU device is still the TPU's
        (
            "{{function_node __inference_train_function_device_/job:localhost/replica:0/task:0/device:CPU:0}} "
            "Compilation failure: Ran out of memory in memory space hbm. Used 9G of 8G hbm.",
            "hbm_out_of_memory",
        ),
        # A TPU device's tensor is neither the host's nor a GPU's (no report of this form is cited: unclaimed)
        (
            "OOM when allocating tensor with shape[8] and type float on /job:worker/task:0/device:TPU:0",
            None,
        ),
    ],
)
def test_each_device_s_out_of_memory_gets_its_own_entry(text, name):
    found = diagnose.match(text)
    assert (found.name if found else None) == name


@pytest.mark.parametrize(
    "unrelated",
    [
        "ValueError: shapes (2, 3) and (4,) are incompatible",
        "No OpKernel was registered to support Op 'Foo'",
        "",
    ],
)
def test_unrelated_errors_are_not_explained(unrelated):
    assert diagnose.explain(unrelated) is None
    assert diagnose.explain(ValueError(unrelated)) is None


def test_annotate_adds_one_note_to_a_known_error_and_none_to_others():
    error = RuntimeError("File system scheme '[local]' not implemented (file: 'x')")
    assert diagnose.annotate(error) is not None
    diagnose.annotate(error)  # an entry point may meet the same error twice
    assert len(error.__notes__) == 1 and error.__notes__[0].startswith("tpukit: Cause: ")
    other = RuntimeError("something else")
    assert diagnose.annotate(other) is None and not hasattr(other, "__notes__")
