"""Fixtures shared by several test modules (plain helper functions live in tests/support.py)."""

import logging
import os
from pathlib import Path

import pytest
import torch

from tokennet import plugins

# Decoding compiles its step by default (tokennet.sampling.compile_default); the suite decodes eagerly, so that only
# the tests that ask for the compiled step (compile=True, or TOKENNET_COMPILE=1 as tests/test_compile_default.py
# sets it) pay for a compilation. Run the suite with TOKENNET_COMPILE=1 to decode compiled everywhere.
os.environ.setdefault("TOKENNET_COMPILE", "0")


def _share_the_cores_among_workers() -> None:
    """Under pytest-xdist (scripts/test.sh runs a worker per core), each worker's torch — and the tokennet processes
    its tests start — use their share of the cores, so that the workers do not oversubscribe them. An
    ``OMP_NUM_THREADS`` set by the caller is kept (``OMP_NUM_THREADS=2`` tests the two-thread paths)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    share = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)


_share_the_cores_among_workers()

# The example plugin (examples/count_ones.py) is registered in every test session, so the registry loops
# (tests/recipes/test_every_recipe.py, test_exact_resume.py, ...) test it like tokennet's own recipes.
EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "count_ones.py"
plugins.load_file(EXAMPLE_PLUGIN)


@pytest.fixture(scope="module")
def one_thread():
    """Pin torch to one thread for a module: as fast for tiny models, and far faster when other processes share
    the cores. Use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A small text file for character-level language-model runs: numbered lines of a pangram."""
    p = tmp_path_factory.mktemp("data") / "corpus.txt"
    p.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300)))
    return p


@pytest.fixture(autouse=True)
def _tokennet_log_level():
    """Undo what an in-process ``tokennet.cli.main`` call leaves behind: it sets the ``tokennet`` logger to WARNING
    under ``--quiet``, which silently drops the INFO lines a later test's ``caplog`` waits for."""
    logger = logging.getLogger("tokennet")
    level = logger.level
    yield
    logger.setLevel(level)
