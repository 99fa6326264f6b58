"""`python -m recipes ...`: the console script `recipes`, run as a module.

`python -m` puts the working directory first on sys.path, where a user's own modules (a
`yaml.py`, a `torch/` folder) would shadow the packages the CLI imports; the console script's
interpreter never has it there. Dropping that entry before anything else is imported gives both
ways in the same sys.path, as `python -P` would (the project's own packages are bound by
recipes/__init__.py already).
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in (os.getcwd(), ""):
    del sys.path[0]

from recipes.cli import main  # noqa: E402  (after the working directory has left sys.path)

sys.exit(main())
