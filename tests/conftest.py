"""Shared fixtures. Every test gets torch's thread count back as it found it; modules of tiny models run
on one thread (``pytestmark = pytest.mark.usefixtures("one_thread")``): many small kernels gain nothing
from more threads, and on a shared, oversubscribed CPU extra threads only wait."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_thread():
    torch.set_num_threads(1)
