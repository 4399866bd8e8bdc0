"""tpukit.environment.diagnose: each known environmental error, as TensorFlow/JAX print it (texts copied from the cited public
reports), maps to its cause and fix; unrelated errors map to nothing. No TPU is involved: these are text matches."""

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
