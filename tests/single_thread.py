"""An autouse fixture for test modules of tiny torch models: import it to run the module on one thread.

A second intra-op thread only adds synchronisation to ops this small; on a busy 2-core machine it made
the student tests 10x slower. The previous thread count is restored after the module.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
