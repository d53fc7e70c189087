"""``python -m freeride_lab.cli`` is ``freeride-lab``."""

import sys

from freeride_lab.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
