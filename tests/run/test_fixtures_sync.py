"""The repo's copy of the shared nvidia-smi fixtures is the same bytes as the original."""
import pytest

from support.paths import H200X2, SHARED_FIXTURES

ORIGINAL = SHARED_FIXTURES / "nvidia-smi" / "h200x2"


@pytest.mark.skipif(not ORIGINAL.is_dir(), reason=f"{ORIGINAL} is not beside this checkout")
@pytest.mark.parametrize("name", sorted(p.name for p in H200X2.iterdir()))
def test_copy_equals_original(name):
    assert (H200X2 / name).read_bytes() == (ORIGINAL / name).read_bytes()
