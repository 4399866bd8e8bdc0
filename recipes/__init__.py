"""The recipe catalogue. Installed as the `tpukit.recipes` package (see setup.cfg's package_dir), so a pip
install ships every YAML file here and `python -m tpukit.train NAME` finds them without a clone."""
