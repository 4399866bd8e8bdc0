"""The jax engine's persistent compilation cache: a later process loads what an earlier one compiled.

JAX compiles every jitted computation at its first call in each process: one XLA compile per kernel shape for
Keras' random initializers while the model is built, and the train step's. With JAX's persistent compilation cache
(https://docs.jax.dev/en/latest/persistent_compilation_cache.html) the next run of the recipe loads them from disk
(what that saves is in docs/performance.md). MaxText turns the same cache on by default (its `jax_cache_dir`).

What tpukit sets, once per process, before anything is compiled:

* the directory: `$TPUKIT_JAX_COMPILATION_CACHE` if it names one, else
  `$XDG_CACHE_HOME/tpukit/jax_compilation_cache` (by default `~/.cache/tpukit/jax_compilation_cache`);
* every compile is kept (`jax_persistent_cache_min_compile_time_secs` 0: JAX's default of 1 s would skip the
  initializers), and the directory is capped at `MAX_BYTES` (JAX evicts the least recently used entries; the
  cap needs the `filelock` package, without which the directory is uncapped, JAX's own default).

Left as it is: a cache the user configured themselves (`JAX_COMPILATION_CACHE_DIR`, or `jax.config` before
tpukit runs), with JAX's own settings (its 1 s minimum compile time too), and the cache off with
`TPUKIT_JAX_COMPILATION_CACHE=0` (or `off`). The cache is keyed by JAX's own fingerprint of the computation, the
compile options, the devices and the jax/jaxlib versions, so a changed model, mesh or install compiles afresh; nothing here changes what is computed. The setting is the process's (JAX
sets its cache up at the first compile and keeps it): a notebook's own JAX code after a run uses it too, which is
why it is not put back when a run returns.
"""

from __future__ import annotations

import logging
import os

import jax

logger = logging.getLogger("tpukit")

ENV = "TPUKIT_JAX_COMPILATION_CACHE"
MAX_BYTES = 2**30  # 1 GiB; the small CNN's whole run stores ~0.3 MB
_OFF = ("0", "off", "false", "no")


def default_dir() -> str:
    """`$XDG_CACHE_HOME/tpukit/jax_compilation_cache`, by default `~/.cache/tpukit/jax_compilation_cache`."""
    from tpukit.engines.keras import flops  # tpukit's cache directory: the peak FLOP/s file's

    return os.path.join(os.path.dirname(flops.default_cache_path()), "jax_compilation_cache")


def _has_filelock() -> bool:
    """JAX's size cap needs the `filelock` package (jax/_src/lru_cache.py raises at the first compile without
    it); without it the directory is left uncapped, as JAX's own default."""
    try:
        import filelock  # noqa: F401
    except ImportError:
        return False
    return True


def use_compilation_cache() -> str | None:
    """Points JAX's persistent compilation cache at tpukit's directory unless the user chose one or turned it
    off; returns the directory in use (None: off). Safe to call more than once."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen.lower() in _OFF:
        return None
    configured = jax.config.jax_compilation_cache_dir
    # The user's own JAX_COMPILATION_CACHE_DIR or jax.config setting, or an earlier call: left as it is.
    if configured:
        return configured
    path = os.path.abspath(os.path.expanduser(chosen)) if chosen else default_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:  # a read-only home: compile every time, as without the cache
        logger.warning("tpukit: no JAX compilation cache (%s: %s)", path, error)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ and _has_filelock():
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    logger.debug("tpukit: JAX compilation cache %s (%s=0 turns it off)", path, ENV)
    return path
