"""SimA's compiled CPU kernel: :mod:`.sima` builds and loads ``sima_cpu.cpp``."""
