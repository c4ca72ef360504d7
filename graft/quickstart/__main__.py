"""`python -m graft.quickstart`: the end-to-end demo (see recipe.py)."""

import sys

from graft.quickstart.recipe import main

sys.exit(main())
