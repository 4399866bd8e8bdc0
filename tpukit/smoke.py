"""`python -m tpukit.smoke`: a few real steps on this machine's accelerator, checked end to end. The tool lives in `tpukit.tools.smoke`."""

import sys

from tpukit.tools.smoke import main

if __name__ == "__main__":
    sys.exit(main())
