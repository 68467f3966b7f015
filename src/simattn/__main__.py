"""``python -m simattn`` (and ``torchrun -m simattn train ...``)."""
import sys

from .cli import main

sys.exit(main())
