"""`keras_private.fresh_names` (tpukit/engines/keras/keras_private.py), in this process: inside it Keras names
objects as a new process would, and afterwards the caller's own counters go on past every name used, so a
notebook's second `tpukit.fit` builds the same names as its first and the user's own layers stay unique. The
jax-engine rerun it makes resume is tests/engines/jax/test_jax_same_process_rerun.py."""

import keras
import pytest

from tpukit.engines.keras import keras_private


class H9Probe(keras.layers.Layer):
    """A layer class of its own, so that its name counter ("h9_probe") starts at 0 in this test process."""


class H9Other(keras.layers.Layer):
    pass


class H9Raise(keras.layers.Layer):
    pass


def test_inside_names_start_over_and_after_the_callers_continue_past_them():
    mine = [H9Probe().name, H9Probe().name]
    with keras_private.fresh_names():
        built = [H9Probe().name, H9Probe().name, H9Probe().name, H9Other().name]
        # Whatever this process built before: a new process's first name.
        dense = keras.layers.Dense(1).name
    with keras_private.fresh_names():
        again = [H9Probe().name, H9Probe().name, H9Probe().name, H9Other().name]
    later = [H9Probe().name, H9Other().name]
    assert mine == ["h9_probe", "h9_probe_1"]
    assert built == again == ["h9_probe", "h9_probe_1", "h9_probe_2", "h9_other"]
    assert dense == "dense"
    # The caller's next names are past both its own (2) and the block's (3): none repeats one of the caller's.
    assert later == ["h9_probe_3", "h9_other_1"]
    assert len(set(mine + later)) == 4


def test_the_callers_counters_are_kept_when_the_block_used_fewer_and_when_it_raises():
    mine = [H9Raise().name for _ in range(3)]
    assert mine == ["h9_raise", "h9_raise_1", "h9_raise_2"]
    uid = keras.backend.get_uid("h9_uid")
    with pytest.raises(RuntimeError), keras_private.fresh_names():
        assert keras.backend.get_uid("h9_uid") == 1  # a new process's first
        assert H9Raise().name == "h9_raise"
        raise RuntimeError("the builder failed")
    assert keras.backend.get_uid("h9_uid") == uid + 1
    assert H9Raise().name == "h9_raise_3"
