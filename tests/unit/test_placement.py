import pytest

from labkit.cluster.placement import layout


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
