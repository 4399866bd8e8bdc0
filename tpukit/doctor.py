"""`python -m tpukit.doctor`: can this environment train, and if not, the exact command that fixes it. The tool lives in `tpukit.tools.doctor`."""

import sys

from tpukit.tools.doctor import main

if __name__ == "__main__":
    sys.exit(main())
