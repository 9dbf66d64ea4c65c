"""`python -m engine ...`: the headless command line."""
import sys

from .cli import main

sys.exit(main())
