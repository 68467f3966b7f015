import os

import pytest
import torch

# Tests measure behaviour, not speed: keep them deterministic and light on a shared 2-core machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    # Tiny models on a busy CPU run fastest single-threaded; restore the suite's setting afterwards.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield 1
    torch.set_num_threads(before)
