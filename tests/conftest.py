"""Shared fixtures (shared functions live in helpers.py). Every test starts from the same global RNG state
and gets torch's thread count back as it found it; modules of tiny models run on one thread
(``pytestmark = pytest.mark.usefixtures("one_thread")``): many small kernels gain nothing from more
threads, and on a shared, oversubscribed CPU extra threads only wait."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_torch():
    """torch.manual_seed(0) before every test: random inputs drawn in a test do not depend on which tests
    ran before it."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """`vitkit train` caches decoded image folders under $XDG_CACHE_HOME: tests keep theirs in a temporary
    folder (inherited by the commands they start), never in the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))
    # and so does vitkit.fit, which caches by default where the command line does without that variable
    monkeypatch.setattr("vitkit.data.cache.USER_CACHE", str(tmp_path_factory.getbasetemp() / "xdg-cache" / "vitkit"))


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_thread():
    torch.set_num_threads(1)
