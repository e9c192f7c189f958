"""``python -m rocm_vit``: the ``rocm-vit`` command without the console script."""

import sys

from rocm_vit.cli.main import main

sys.exit(main())
