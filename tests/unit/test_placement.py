import pytest

from labkit.cluster.placement import PIN, PlacementError, PlacementSpec, cross_node, layout


def test_colocated_shares_bundles_disaggregated_does_not():
    c = layout("colocated", trainer_ranks=2, engines=1, gpus_per_bundle=1)
    assert len(c.bundles) == 2 and c.assign["trainer:0"] == c.assign["engine:0"]
    assert c.bundles[0] == {"CPU": 1.0, "GPU": 1}
    d = layout("disaggregated", trainer_ranks=2, engines=1)
    assert len(d.bundles) == 3 and d.assign["engine:0"] not in {d.assign["trainer:0"], d.assign["trainer:1"]}
    assert len(set(d.assign.values())) == 3


@pytest.mark.parametrize("args,match", [(("mixed", 1), "mode='mixed'"), (("colocated", 0), "trainer_ranks=0")])
def test_bad_layouts_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        layout(*args)


def test_node_pins_go_into_every_bundle_of_their_side():
    d = layout(PlacementSpec(mode="disaggregated", trainer_resource="trainer", engine_resource="engine"), 2, 1)
    assert [b.get("trainer") for b in d.bundles] == [PIN, PIN, None]
    assert [b.get("engine") for b in d.bundles] == [None, None, PIN]
    c = layout(PlacementSpec(trainer_resource="box", engine_resource="box"), 2, 1, cpus_per_bundle=2.0)
    assert c.bundles == ({"CPU": 2.0, "box": PIN}, {"CPU": 2.0, "box": PIN})
    assert layout(PlacementSpec(), 1, 1) == layout("colocated", 1, 1)  # no pins: as before
    two = layout(PlacementSpec(mode="disaggregated", engines=2, engine_resource="engine"), 1, 2)
    assert [b.get("engine") for b in two.bundles] == [None, PIN, PIN] and two.assign["engine:1"] == 2


@pytest.mark.parametrize("kw,match", [
    (dict(mode="spread"), "placement='spread'"),
    (dict(trainer_resource="CPU"), "trainer_resource='CPU'"),
    (dict(engine_resource=" engine"), "engine_resource=' engine'"),
    (dict(engines=0), "engines=0"),
    (dict(engines=True), "engines=True"),
])
def test_bad_placement_specs_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        PlacementSpec(**kw)


def test_colocated_across_pinned_nodes_is_refused_before_anything_starts():
    with pytest.raises(PlacementError, match="trainer_resource='trainer' and engine_resource='engine'.*disaggregated"):
        PlacementSpec(mode="colocated", trainer_resource="trainer", engine_resource="engine")


def test_cross_node_reads_node_ids_first_then_routable_addresses():
    a, b = {"node_id": "n1", "node_ip": "127.0.0.1"}, {"node_id": "n2", "node_ip": "127.0.0.1"}
    assert cross_node(a, b) is True and cross_node(a, dict(a)) is False
    assert cross_node({"node_ip": "10.0.0.1"}, {"node_id": None, "node_ip": "10.0.0.2"}) is True
    assert cross_node({"node_ip": "10.0.0.1"}, {"node_ip": "10.0.0.1"}) is False
    assert cross_node({"node_ip": "127.0.0.1"}, {"node_ip": "127.0.0.1"}) is None  # loopback tells nothing
