"""labkit.sync.fanout.EngineGroup: every call reaches every member; one weight-update group with each engine's
TP ranks at their own offsets; the first member's answer (or error, once all ended)."""

import pickle

import pytest

from labkit.engine.errors import EngineUnreachable
from labkit.sync.fanout import EngineGroup, Replicas


class Member:
    def __init__(self, tp=1, node="n1", fail=False, ip="127.0.0.1"):
        self.tp_size, self._node, self.fail, self.calls, self._ip = tp, node, fail, [], ip

    def init_weights_update_group(self, **kw):
        self.calls.append(("init", kw))
        return "joined"

    def end_weight_update(self):
        self.calls.append(("end", {}))
        if self.fail:
            raise RuntimeError("engine gone")
        return "ok"

    def update_weights_from_tensor(self, named):
        self.calls.append(("update", {}))
        if self.fail:
            raise EngineUnreachable("did not answer within 10 s")
        return "ok"

    def node(self):
        return {"node_id": self._node, "node_ip": self._ip}

    def checksums(self):
        self.calls.append(("checksums", {}))
        return {"w": "h"}


def test_one_group_gives_each_engine_its_ranks():
    a, b, c = Member(tp=1), Member(tp=2), Member(tp=1)
    g = EngineGroup([a, b, c], ids=[0, 2, 3])
    assert g.tp_size == 4
    g.init_weights_update_group(master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=5,
                                group_name="g", backend="gloo")
    assert [m.calls[0][1]["rank_offset"] for m in (a, b, c)] == [1, 2, 4]  # trainer is rank 0
    assert all(m.calls[0][1]["world_size"] == 5 for m in (a, b, c))
    assert set(g.fanout_metrics()) == {"timing/sync/engine/0/calls", "timing/sync/engine/2/calls",
                                       "timing/sync/engine/3/calls"}


def test_a_failing_member_fails_the_call_but_every_member_got_it():
    a, b = Member(), Member(fail=True)
    g = EngineGroup([a, b])
    with pytest.raises(RuntimeError, match="engine gone"):
        g.end_weight_update()
    assert a.calls == [("end", {})] and b.calls == [("end", {})]  # the live one still closed its session


def test_checksums_are_read_from_the_first_member_only_and_the_group_pickles():
    a, b = Member(), Member(node="n2")
    g = EngineGroup([a, b])
    assert g.checksums() == {"w": "h"} and b.calls == []
    assert g.node()["node_id"] == "several"  # a same-node transport is refused against it (sync.transport.where)
    assert pickle.loads(pickle.dumps(g)).tp_size == 2
    with pytest.raises(ValueError, match="delta"):
        g.weight_version


def test_replicas_want_distinct_engines():
    m = Member()
    with pytest.raises(ValueError, match="distinct"):
        Replicas([m, m])
    with pytest.raises(ValueError, match="engines=\\[\\]"):
        Replicas([])


def test_replicas_refuse_a_sync_that_reaches_one_engine_only_before_any_call():
    """`direct` writes into one engine's own parameters (an EngineGroup answers with the first member's files),
    and a delta is computed against one engine's copy: several engines are refused, nothing asked of them."""
    from labkit.sync import SyncConfig

    members = [Member(), Member()]
    r = Replicas(members)
    try:
        with pytest.raises(ValueError, match="transport='direct' .* 2 engines"):
            r.sync(None, SyncConfig(transport="direct", progress=False))
        with pytest.raises(ValueError, match="SyncConfig.delta=2"):
            r.sync(None, SyncConfig(delta=2, progress=False))
        assert all(not m.calls for m in members) and r.synced == 0
    finally:
        r.close()


def test_an_http_server_beside_a_ray_actor_engine_is_one_place_unless_addresses_say_otherwise():
    """An HTTP engine has no Ray node id (its URL's host stands for it): beside an actor engine on this machine
    the group is that actor's node, so colocated syncs reach both (the soak found them refused as "several")."""
    actor, server = Member(node="n1"), Member(node=None)
    assert EngineGroup([server, actor]).node() == {"node_id": "n1", "node_ip": "127.0.0.1"}
    far = Member(node=None, ip="10.0.0.9")
    assert EngineGroup([Member(node="n1", ip="10.0.0.1"), far]).node()["node_id"] == "several"


def test_a_member_that_did_not_answer_is_not_asked_again_while_the_others_are():
    """A hung engine's calls each wait out the call timeout: after its first, the group stops asking it, so
    the calls that close a failed sync reach the live engines at once instead of the sync's deadline."""
    live, hung = Member(), Member(fail=True)
    g = EngineGroup([live, hung])
    with pytest.raises(EngineUnreachable):
        g.update_weights_from_tensor([])
    hung.fail = False  # it would answer now: it is still not asked
    with pytest.raises(EngineUnreachable, match="did not answer an earlier call"):
        g.end_weight_update()
    assert live.calls == [("update", {}), ("end", {})] and hung.calls == [("update", {})]

