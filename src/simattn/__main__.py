"""``python -m simattn`` (and ``torchrun -m simattn train ...``)."""
import sys

from simattn_cli import main

sys.exit(main())
