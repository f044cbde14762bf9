"""Another SGLang / megatron-core than the compat layers were written for: a message naming both versions, from
the version lookup (package metadata), before anything is imported or patched."""

from importlib import metadata

import pytest

from labkit import compat, doctor
from labkit.compat import megatron as mcompat
from labkit.compat import sglang as scompat

FAKE = {"sglang": "0.5.99", "megatron-core": "0.17.0"}


@pytest.fixture
def other_versions(monkeypatch):
    real = metadata.version
    monkeypatch.setattr(compat.metadata, "version", lambda dist: FAKE.get(dist) or real(dist))


def test_sglang_guard_names_the_found_and_the_supported_version(other_versions):
    with pytest.raises(RuntimeError, match=r"written for sglang 0\.5\.23, found sglang '0\.5\.99'; install the "
                                           r"pinned version \(see requirements.txt\)"):
        scompat.check_sglang_version()


def test_megatron_guard_names_the_found_and_the_supported_version(other_versions):
    with pytest.raises(RuntimeError, match=r"written for megatron-core 0\.16\.1, found megatron-core '0\.17\.0'"):
        mcompat.check_megatron_version()


def test_megatron_layer_refuses_before_patching_anything(other_versions):
    if not mcompat.needed() or mcompat.active():
        pytest.skip("the CPU layer is not needed here or already applied in this process")
    with pytest.raises(RuntimeError, match="found megatron-core '0.17.0'"):
        mcompat.apply()
    assert mcompat.active() == []  # nothing half-applied


def test_missing_package_is_named(monkeypatch):
    def absent(dist):
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(compat.metadata, "version", absent)
    with pytest.raises(RuntimeError, match="sglang is not installed"):
        scompat.check_sglang_version()


def test_doctor_lists_the_mismatch(other_versions):
    r = doctor.report()
    assert r["sglang"] == "0.5.99" and r["megatron_core"] == "0.17.0"
    if r["compat"]:  # CPU: the layers are planned, so their versions matter
        assert any("found sglang '0.5.99'" in p and "0.5.23" in p for p in r["compat_problems"])
        assert any("found megatron-core '0.17.0'" in p for p in r["compat_problems"])
        assert "found sglang '0.5.99'" in doctor.format_text(r)
    else:  # CUDA: the layers are off and other versions are the user's choice
        assert r["compat_problems"] == []


def test_the_installed_stack_passes():
    assert compat.version_problem("sglang") is None and compat.version_problem("megatron-core") is None
