"""What tpukit knows about the environment it runs in, without importing TensorFlow, Keras or JAX.

`versions`: the TensorFlow / Keras / libtpu combinations tpukit supports, with their sources. `diagnose`: known
environmental errors (wrong TPU build, unreachable TPU, HBM exhausted, ...) translated into cause and fix.
`engine_choice`: the engine `runtime.engine: auto` trains with here, and why. `backend`: the Keras backend choice,
made before Keras is first imported. The doctor (`tpukit.tools.doctor`) and the engines build on these; they
import nothing from the rest of tpukit.
"""
