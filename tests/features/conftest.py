import pytest


@pytest.fixture(autouse=True)
def _feature_cache(tmp_path, monkeypatch):
    """Every test's features are cached under its own tmp_path (never ~/.cache), also in processes it starts."""
    monkeypatch.setenv("SILOFL_CACHE", str(tmp_path / "cache"))
