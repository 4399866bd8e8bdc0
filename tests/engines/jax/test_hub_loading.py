"""A KerasHub preset loaded straight into its layout on the jax engine (issue 41 item 2), on 8 virtual CPU devices
in JAX-backend processes of their own.

What it proves: a tiny Gemma preset built through the engine's path (`engine._compiled` with the engine's
distribution and no `runtime.layout`) on a 2x4 and a 1x8 mesh holds exactly the preset's weights, laid out by
`GemmaBackbone.get_layout_map` (some variables split on `model`), with the dimensions the mesh does not divide (2
key/value heads over 4 or 8 devices; a vocabulary of 30 over 4) left whole and named in a plan line, where plain
KerasHub under `ModelParallel` raises `IndivisibleError`; every host value assigned to a laid-out variable arrives
sharded (`compat.sharded_assign`), where Keras' own `assign` makes a full copy on one device; and the load of a
~67 MB preset raises the process's peak memory by about one copy of the weights. What it does not prove: anything
about a TPU's HBM (on a CPU the devices are the host's memory), or a preset larger than this machine.
"""

import json

import pytest
from helpers import run_jax_snippet

pytest.importorskip("keras_hub")

EIGHT_DEVICES = "--xla_force_host_platform_device_count=8"

COMMON = r'''
import contextlib, json, logging, os, sys, tempfile, types
import tpukit
tpukit.use_engine("jax")
import jax, keras, numpy as np
from keras.src.backend.jax.core import JaxVariable
from tpukit import task
from tpukit.engines.jax import compat, engine
from tpukit.models import MODELS, hub

class Lines(logging.Handler):
    """tpukit's log lines."""
    def __init__(self):
        super().__init__(logging.INFO)
        self.seen = []
    def emit(self, record):
        self.seen.append(record.getMessage())

LINES = Lines()
logging.getLogger("tpukit").addHandler(LINES)
logging.getLogger("tpukit").setLevel(logging.INFO)

# The builder alone: the data a recipe would fit the model to is another part of issue 41.
task.build_model = lambda recipe, *args, **kwargs: MODELS[recipe.model.name](**recipe.model.kwargs)

def engine_build(preset, data, model, patched=True):
    """The model as the engine builds it (`engine._compiled` in the engine's distribution), without runtime.layout;
    `patched=False`: Keras' own assign."""
    arguments = {"preset": preset, "sequence_length": 16}
    settings = types.SimpleNamespace(layout=None, model_name="keras_hub_causal_lm",
                                     keys={"model arguments": arguments})
    mesh = engine.Mesh(data, model, jax.devices()[: data * model])
    distribution = engine._distribution(settings, mesh)
    recipe = types.SimpleNamespace(path="hub.yaml",
                                   model=types.SimpleNamespace(name="keras_hub_causal_lm", kwargs=arguments))
    the_plan = types.SimpleNamespace(recipe=recipe, strategy=mesh, jit_compile=True, labels=None)
    kept = compat.sharded_assign
    if not patched:
        compat.sharded_assign = lambda: contextlib.nullcontext(False)
    try:
        built = engine._compiled(the_plan, distribution, 1, 10)
    finally:
        compat.sharded_assign = kept
    return built, distribution
'''

LOAD = (
    COMMON
    + r"""
import keras_hub

# [path, shape, devices, the variable's shape] of each value assigned to a laid-out variable after its creation
# (Keras creates a variable below 250 MB x devices on one device, then lays it out: `should_shard_at_init`).
ASSIGNED, CREATING = [], []
direct, initialize = JaxVariable._direct_assign, JaxVariable._initialize
def spying(self, value):
    if self._layout is not None and isinstance(value, jax.Array) and not CREATING:
        ASSIGNED.append([self.path, list(value.shape), len(value.sharding.device_set), list(self.shape)])
    return direct(self, value)
def creating(self, value):
    CREATING.append(self)
    try:
        return initialize(self, value)
    finally:
        CREATING.pop()
JaxVariable._direct_assign, JaxVariable._initialize = spying, creating

# Two words fewer than the tiny vocabulary: 30 tokens, which a model axis of 4 does not divide.
preset = hub.tiny_preset(tempfile.mkdtemp(), texts=[" ".join(hub.TINY_WORDS[:-2])] * 2)
reference = {v.path: np.asarray(v.value) for v in keras_hub.models.GemmaCausalLM.from_preset(preset).weights}
result = {}
for data, model in ((2, 4), (1, 8)):
    LINES.seen.clear()
    ASSIGNED.clear()
    built, distribution = engine_build(preset, data, model)
    weights = {v.path: v for v in built.weights}
    result[f"{data}x{model}"] = {
        "same": sorted(p for p in reference if np.array_equal(np.asarray(weights[p].value), reference[p])),
        "specs": {p: [a if isinstance(a, (str, type(None))) else list(a) for a in v.value.sharding.spec]
                  for p, v in weights.items()},
        "shards": {p: list(v.value.addressable_shards[0].data.shape) for p, v in weights.items()},
        "lines": [line for line in LINES.seen if line.startswith("tpukit plan: layout")],
        "assigned": list(ASSIGNED),
    }
result["paths"] = sorted(reference)
result["vocabulary"] = int(reference["token_embedding/embeddings"].shape[0])
ASSIGNED.clear()
engine_build(preset, 2, 4, patched=False)
result["unpatched_assigned"] = list(ASSIGNED)
# Plain KerasHub on the same preset and mesh: the family's map fails where a dimension does not divide.
mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices=jax.devices())
plain = keras.distribution.ModelParallel(
    layout_map=keras_hub.models.GemmaBackbone.get_layout_map(mesh), batch_dim_name="batch")
try:
    with plain.scope():
        keras_hub.models.GemmaCausalLM.from_preset(preset)
    result["plain"] = "loaded"
except Exception as error:
    result["plain"] = type(error).__name__
print("RESULT " + json.dumps(result))
"""
)


@pytest.mark.integration
def test_a_tiny_gemma_preset_loads_into_its_family_layout_sharded_and_exact():
    result = run_jax_snippet(LOAD, "load", XLA_FLAGS=EIGHT_DEVICES)
    # Without tpukit's leniency the family's own map fails on this preset and mesh.
    assert result["plain"] == "IndivisibleError"
    kv = [p for p in result["paths"] if p.endswith(("/key/kernel", "/value/kernel"))]
    for mesh, model in (("2x4", 4), ("1x8", 8)):
        run = result[mesh]
        assert run["same"] == result["paths"], mesh  # every weight equals the preset's, bit for bit
        specs, shards, lines = run["specs"], run["shards"], run["lines"]
        assert lines[0].startswith(
            "tpukit plan: layout: GemmaBackbone.get_layout_map (KerasHub) for preset "
        ), lines
        # The family's map applied: Gemma's feed-forward kernels split on model (and data, FSDP-like).
        # (The data axis of the 1x8 mesh has one device: named in the spec, it splits nothing.)
        data = 8 // model
        assert specs["decoder_block_0/ffw_gating/kernel"] == ["data", "model"]
        assert shards["decoder_block_0/ffw_gating/kernel"] == [32 // data, 32 // model]
        assert specs["decoder_block_0/ffw_linear/kernel"] == ["model", "data"]
        # 2 key/value heads do not divide by the model axis: that dimension whole, the data split kept.
        for path in kv:
            assert specs[path] == [None, "data", None], (mesh, path, specs[path])
            assert shards[path] == [2, 32 // data, 8], (mesh, path, shards[path])
        unsplit = [line for line in lines if "of decoder_block_0/attention/key/kernel" in line]
        assert len(unsplit) == 1, lines
        assert (
            f"left unsplit: mesh axis 'model' has {model} devices, which do not divide 2 (entry "
            "'decoder_block.*attention.*(query|key|value).kernel' of GemmaBackbone.get_layout_map (KerasHub))"
        ) in unsplit[0]
        assert "dimension 0 of " in unsplit[0] and "size 2)" in unsplit[0]
        assert all(p in unsplit[0] for p in kv[:4]) and "(4 variables, size 2)" in unsplit[0]
        # Every host value assigned to a laid-out variable arrived sharded over the mesh, never whole on one device.
        assert run["assigned"], mesh
        for path, shape, devices, variable_shape in run["assigned"]:
            assert devices == 8 and shape == variable_shape, (mesh, path, devices)
    # The 1x8 mesh: 4 query heads do not divide by 8 either.
    assert any(
        "of decoder_block_0/attention/query/kernel" in line for line in result["1x8"]["lines"]
    )
    # A vocabulary the model axis does not divide (30 tokens over 4) stays whole; the hidden dimension still splits
    # on data.
    vocabulary = result["vocabulary"]
    assert vocabulary % 4, (
        f"the test needs a vocabulary that 4 does not divide; the tiny preset made {vocabulary}"
    )
    assert result["2x4"]["specs"]["token_embedding/embeddings"] == [None, "data"]
    assert result["2x4"]["shards"]["token_embedding/embeddings"] == [vocabulary, 16]
    # Keras' own assign (without `compat.sharded_assign`) puts each whole value on one device first: the check above
    # would fail without tpukit's patch.
    whole = [a for a in result["unpatched_assigned"] if a[2] == 1 and a[1] == a[3]]
    assert len(whole) >= len(result["paths"]) - 5, result["unpatched_assigned"][:5]


# A preset of ~67 MB of float32 weights: 4 blocks of hidden 512 (8 query and 8 key/value heads of 64, so a model
# axis of 4 divides them) and feed-forward 2048, over the tiny word vocabulary.
BIG = dict(
    num_layers=4,
    hidden_dim=512,
    intermediate_dim=4096,
    num_query_heads=8,
    num_key_value_heads=8,
    head_dim=64,
)

WRITE = r"""
import json, sys
from tpukit.models import hub
case = json.loads(sys.argv[1])
hub.tiny_preset(case["tiny"])
hub.tiny_preset(case["preset"], **case["backbone"])
print("RESULT {}")
"""

MEASURE = (
    COMMON
    + r"""
import gc, resource

def rss():
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

case = json.loads(sys.argv[1])
def load(preset):
    if case["how"] == "keras_hub":  # plain KerasHub on one device, for comparison
        import keras_hub
        return keras_hub.models.GemmaCausalLM.from_preset(preset)
    return engine_build(preset, 2, 4, patched=case["how"] == "tpukit")[0]

load(case["tiny"])  # KerasHub imported, the tokenizer and the engine's first programs compiled
gc.collect()
before = rss()["VmRSS"]
with open("/proc/self/clear_refs", "w") as refs:  # the peak (VmHWM) from here on: the load's
    refs.write("5")
reset = rss()["VmHWM"] <= before + (1 << 20)
built = load(case["preset"])
peak = rss()["VmHWM"] if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in built.weights)
print("RESULT " + json.dumps({"before": before, "peak": peak, "after": rss()["VmRSS"], "weights": weights,
                              "reset": reset}))
"""
)

# glibc's malloc raises its mmap threshold as large blocks are freed, after which it keeps freed memory in the
# heap: the random initial values the loaded ones replace and each variable's numpy read would then stay in RSS as
# free memory (about 2 more copies here, with plain KerasHub on one device as well). A fixed threshold returns
# freed large blocks to the system, so RSS measures the memory in use.
LIVE_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def measure(preset: str, tiny: str, how: str, **env) -> dict:
    case = json.dumps({"preset": preset, "tiny": tiny, "how": how})
    return run_jax_snippet(MEASURE, case, XLA_FLAGS=EIGHT_DEVICES, **env)


@pytest.mark.integration
def test_loading_a_preset_sharded_peaks_at_about_one_copy_of_its_weights(tmp_path):
    preset, tiny = str(tmp_path / "preset"), str(tmp_path / "tiny")
    run_jax_snippet(WRITE, json.dumps({"preset": preset, "tiny": tiny, "backbone": BIG}))
    measured = measure(preset, tiny, "tpukit", **LIVE_MEMORY)
    assert measured["reset"], measured  # the peak is the load's, not the imports'
    weights, grown = measured["weights"], measured["peak"] - measured["before"]
    assert 60e6 < weights < 80e6, weights
    # On CPU the 8 devices are this process's memory: the model itself is one copy (every weight split over the 8
    # devices but the vocabulary's 30 rows and the norms), plus one variable read from the file and its shards
    # (8 MB here), plus the XLA programs compiled for the new shapes: 32 MB covers those.
    print(f"weights {weights / 1e6:.1f} MB, load peak +{grown / 1e6:.1f} MB ({measured})")
    assert grown <= 1.5 * weights + 32e6, measured


# Variable paths and shapes of KerasHub decoders: Gemma's blocks (heads first) and Llama's/Qwen's (hidden first).
GEMMA_VARIABLES = {
    "token_embedding/embeddings": (256, 32),
    "decoder_block_0/pre_attention_norm/scale": (32,),
    "decoder_block_0/attention/query/kernel": (4, 32, 8),
    "decoder_block_0/attention/key/kernel": (2, 32, 8),
    "decoder_block_0/attention/value/kernel": (2, 32, 8),
    "decoder_block_0/attention/attention_output/kernel": (4, 8, 32),
    "decoder_block_0/ffw_gating/kernel": (32, 64),
    "decoder_block_0/ffw_gating_2/kernel": (32, 64),
    "decoder_block_0/ffw_linear/kernel": (64, 32),
}
LLAMA_VARIABLES = {
    "token_embedding/embeddings": (256, 32),
    "transformer_layer_0/self_attention/query/kernel": (32, 4, 8),
    "transformer_layer_0/self_attention/key/kernel": (32, 2, 8),
    "transformer_layer_0/self_attention/value/kernel": (32, 2, 8),
    "transformer_layer_0/self_attention/attention_output/kernel": (4, 8, 32),
    "transformer_layer_0/feedforward_intermediate_dense/kernel": (32, 64),
    "transformer_layer_0/feedforward_gate_dense/kernel": (32, 64),
    "transformer_layer_0/feedforward_output_dense/kernel": (64, 32),
    "transformer_layer_0/self_attention_layernorm/scale": (32,),
}


@pytest.mark.parametrize(
    "family, variables",
    [("GemmaBackbone", GEMMA_VARIABLES), ("LlamaBackbone", LLAMA_VARIABLES)],
)
def test_tpukits_decoder_rules_lay_out_as_the_families_own_maps(family, variables):
    """Where a family has no get_layout_map, tpukit's rules split a KerasHub decoder as Gemma's and Llama's do."""
    import keras_hub

    from tpukit.models.layouts import KERAS_HUB_DECODER
    from tpukit.planner.layouts import Layouts
    from tpukit.recipe.layout_maps import from_builder

    mesh = {"data": 2, "model": 2}
    builder = getattr(keras_hub.models, family).get_layout_map
    theirs = Layouts(from_builder(builder, mesh, family)[0], mesh, family, lenient=True)
    mine = Layouts(KERAS_HUB_DECODER, mesh, "tpukit's rules", lenient=True)
    for path, shape in variables.items():
        assert mine.axes_for(path, shape) == theirs.axes_for(path, shape), path
    assert (
        len(mine.sharded()) == len(variables) - 1
    )  # every kernel and the embedding; the norm stays whole


def test_a_default_layout_leaves_what_does_not_divide_whole_and_a_users_fails():
    from tpukit.models.layouts import KERAS_HUB_DECODER
    from tpukit.planner.layouts import Layouts
    from tpukit.recipe import RecipeError

    mesh = {"data": 2, "model": 4}
    mine = Layouts(KERAS_HUB_DECODER, mesh, "tpukit's rules", lenient=True)
    axes = {path: mine.axes_for(path, shape) for path, shape in GEMMA_VARIABLES.items()}
    # 2 key/value heads over 4 devices: that dimension whole, the data split kept; 4 query heads split.
    assert axes["decoder_block_0/attention/key/kernel"] == (None, "data", None)
    assert axes["decoder_block_0/attention/query/kernel"] == ("model", "data", None)
    # A fused 2-D projection that the 3-D rule names stays whole instead of failing.
    assert mine.axes_for("decoder_block_1/attention/query/kernel", (32, 12)) == (None, None)
    mine.check_matched(
        list(GEMMA_VARIABLES)
    )  # the transformer_layer rules match nothing here: noted
    lines = mine.leniency_lines()
    assert (
        "layout: dimension 0 of decoder_block_0/attention/key/kernel, decoder_block_0/attention/value/kernel "
        "(2 variables, size 2) left unsplit: mesh axis 'model' has 4 devices, which do not divide 2 (entry "
        "'.*(decoder_block|transformer_layer).*attention.*/(query|key|value)/kernel' of tpukit's rules)"
    ) in lines
    assert any(
        "decoder_block_1/attention/query/kernel (1 variable) left whole" in line for line in lines
    )
    assert any(
        "matched no variable of this model" in line and "feedforward" in line for line in lines
    )
    # A user's runtime.layout stays strict.
    strict = Layouts(KERAS_HUB_DECODER, mesh, "runtime.layout")
    with pytest.raises(RecipeError, match="but 2 does not divide by 4"):
        strict.axes_for("decoder_block_0/attention/key/kernel", (2, 32, 8))
