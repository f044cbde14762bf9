"""The engine's checksum memo (labkit.engine.inside.checkmemo): which requests keep it, which forget it."""

import importlib.util
import re
from pathlib import Path

import pytest

from labkit.engine.inside import checkmemo


def _request(kind: str, **fields):
    return type(kind, (), fields)()


REPLY = {"checksums": {"w": "xxh3:0"}, "per_gpu_checksum": "x"}


def _memo() -> checkmemo.Memo:
    m = checkmemo.Memo()
    m.enable()
    m.store("target", None, REPLY)
    return m


def test_off_until_a_dispatcher_reports_requests():
    m = checkmemo.Memo()
    m.store("target", None, REPLY)
    assert not m.on and m.lookup("target", None) is None
    m.enable()
    assert m.on


@pytest.mark.parametrize("kind", sorted(checkmemo.READ_ONLY - {"CheckWeightsReqInput"}))
def test_read_only_requests_keep_it(kind):
    m = _memo()
    m.note(_request(kind))
    assert m.lookup("target", None) == REPLY and m.hits == 1


@pytest.mark.parametrize("kind,fields", [
    ("UpdateWeightsFromTensorReqInput", {}), ("UpdateWeightFromDiskReqInput", {}),
    ("UpdateWeightsFromDistributedReqInput", {}), ("UpdateWeightsFromIPCReqInput", {}),
    ("BeginWeightUpdateReqInput", {}), ("ResumeMemoryOccupationReqInput", {}), ("RpcReqInput", {}),
    ("SomeRequestALaterSGLangAdds", {}), ("CheckWeightsReqInput", {"action": "reset_tensors"}),
])
def test_any_other_request_forgets_it(kind, fields):
    m = _memo()
    m.note(_request(kind, **fields))
    assert m.lookup("target", None) is None and m.hits == 0


def test_checksum_requests_keep_it_and_roles_and_skips_are_apart():
    m = _memo()
    m.note(_request("CheckWeightsReqInput", action="checksum"))
    assert m.lookup("target", None) == REPLY
    assert m.lookup("draft", None) is None and m.lookup("target", ["w"]) is None


def test_a_reply_handed_out_cannot_change_the_memo():
    m = _memo()
    m.lookup("target", None)["checksums"]["w"] = "tampered"
    assert m.lookup("target", None) == REPLY


def test_hold_until_release_and_disable_for_good():
    m = _memo()
    m.hold("direct share")
    m.store("target", None, REPLY)
    assert not m.on and m.lookup("target", None) is None
    m.release()
    m.store("target", None, REPLY)
    assert m.lookup("target", None) == REPLY
    m.disable("EPLB")
    m.enable()  # a disable stays in force
    m.store("target", None, REPLY)
    assert not m.on and m.lookup("target", None) is None


def test_the_read_only_names_are_sglangs():
    """A misspelt name would forget the memo on every generate: it must name a request class SGLang has."""
    spec = importlib.util.find_spec("sglang")  # read, not imported: importing SGLang's io_struct takes ~15 s
    src = (Path(spec.submodule_search_locations[0]) / "srt" / "managers" / "io_struct.py").read_text()
    classes = set(re.findall(r"^class (\w+)\b", src, re.M))
    assert "GenerateReqInput" in classes and not [k for k in checkmemo.READ_ONLY if k not in classes]
