"""Fixtures of the model tests."""
import pytest

from tests.models.helpers import save_tiny_hf as _save


@pytest.fixture
def save_tiny_hf(tmp_path):
  """save_tiny_hf(kind, **overrides) -> (directory, torch model) of a tiny random HF model."""
  return lambda kind, **overrides: _save(tmp_path / kind, kind, **overrides)
