"""`python -m tpukit.check`: would this recipe run on a given TPU (cores, topology, memory, input paths). The tool lives in `tpukit.tools.check`."""

import sys

from tpukit.tools.check import main

if __name__ == "__main__":
    sys.exit(main())
