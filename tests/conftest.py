"""Test-wide setup: 8 simulated CPU devices so sharding tests see a mesh; deterministic, quiet JAX; one
compilation cache for the run, each file's programs dropped after it; files with slow tests first."""
import gc
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Many tests (and the trainer and engine processes they start, which inherit the environment) compile the
# same small programs: one persistent compilation cache serves them all. It is made fresh for each run
# and removed after it, so no cache outlives the code that filled it.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="clawjax-test-jax-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_collection_modifyitems(session, config, items):
  """Files holding a test marked slow run first (each file's tests keep their order).

  scripts/test.sh hands whole files to two workers in the order collected (`--no-loadscope-reorder`; xdist's
  own order, most tests first, put the one-test integration files last, and a 4-minute one then ran alone
  at the end of the run while the other worker sat idle).
  """
  del session, config
  slow_files = {item.path for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Each test file's compiled programs are dropped after it: a worker runs some hundred files, and
  holding every program it ever compiled grew it past 7 GiB, pressing two workers and their trainer
  processes into 24 GiB. A later file that needs a program again reads it from the persistent cache."""
  yield
  import jax  # pylint: disable=import-outside-toplevel  (after the environment above is set)
  jax.clear_caches()
  gc.collect()


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _OWN_CACHE:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
