"""labkit.compat.cpu_tp: the thread binding of a CPU engine's TP ranks, and SGLang's TP groups without NCCL."""

import types

import pytest

from labkit.compat import cpu_tp


@pytest.mark.parametrize("tp,cpus,want", [(1, [0, 1], "0-1"), (2, [0, 1], "0|1"), (3, list(range(8)), "0-2|3-5|6-7"),
                                          (2, [0, 2, 4, 6], "0,2|4,6"), (2, [3, 4, 5], "3-4|5")])
def test_ranks_get_contiguous_groups_of_this_process_cpus(tp, cpus, want):
    assert cpu_tp.threads_bind(tp, cpus) == want


def test_more_ranks_than_cores_is_refused_naming_tp():
    with pytest.raises(ValueError, match="tp=3 is invalid on this CPU engine: .* the 2 CPUs"):
        cpu_tp.threads_bind(3, [0, 1])


def test_the_launch_sets_the_binding_only_at_tp_above_1_and_never_over_the_users():
    assert cpu_tp.launch_env(1, {}) == {}
    assert cpu_tp.launch_env(2, {cpu_tp.BIND: "0|1"}) == {}
    assert set(cpu_tp.launch_env(2, {})) == {cpu_tp.BIND}


def test_tp_groups_default_to_no_pynccl_and_an_explicit_choice_stands():
    seen = []
    module = types.SimpleNamespace(init_model_parallel_group=lambda *a, **k: seen.append(k.get("use_pynccl")))
    cpu_tp._no_pynccl(module)
    cpu_tp._no_pynccl(module)  # idempotent: wrapped once
    module.init_model_parallel_group([[0, 1]], 0, "gloo")
    module.init_model_parallel_group([[0, 1]], 0, "gloo", use_pynccl=True)
    assert seen == [False, True]
