"""Tools around the training core: `doctor` (can this environment train?), `check` (would this recipe run on a
given TPU?) and `smoke` (a few real steps on this machine). They import the core; the core never imports them.
Run them as `python -m tpukit.doctor`, `python -m tpukit.check`, `python -m tpukit.smoke`."""
