"""Sorts whose tie order cannot reach an output run unchecked (ortlite/lower/tie_order.py).

The proof is tested against an oracle that needs no proof: each program's aten graph is run
again with every sort's ties ordered at random (a valid order for aten's unstable sort). A
program the proof calls "tie order unobservable" must give the same outputs for every order;
the programs whose outputs do change must keep their check. The programs are the routing
forms of mixture-of-experts layers (argsort of expert ids, histc offsets, grouped
and batched products, the rows put back by an inverse permutation, index_add or a sum) and
the ways each can leak the order.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import ortlite
from conftest import Wrap
from ortlite.decomp import decomposition_table
from ortlite.lower.tie_order import SORTS, TIE_ORDER, mark_tie_orders

T, H, E, K = 12, 8, 4, 2  # tokens, width, experts, experts per token


def routing(x, gate):
    """Top-k expert ids per token (random floats: no ties among the logits)."""
    weights, ids = torch.topk(torch.softmax(x @ gate, -1), K, -1)
    return weights.reshape(-1), ids.reshape(-1)


def grouped(x, rows, w, ids, *, low=0):
    """Rows of each expert times its weight (transformers' grouped mm), the rows of expert e
    after those of the experts before it: offsets counted from the ids (sorted or not)."""
    offsets = torch.cumsum(torch.histc(ids.float(), bins=E, min=low, max=E - 1), 0, dtype=torch.int32)
    return torch.ops.transformers.grouped_mm_fallback(rows, w, offsets)


def moe_grouped(x, gate, w):
    """transformers' grouped_mm experts: sort, grouped products, inverse permutation, sum."""
    weights, ids = routing(x, gate)
    ids_sorted, perm = torch.sort(ids)
    out = grouped(x, x[perm // K], w, ids_sorted) * weights[perm].unsqueeze(-1)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.size(0))
    return out[inverse].view(T, K, H).sum(1)


def moe_argsort_inverse(x, gate, w):
    weights, ids = routing(x, gate)
    perm = torch.argsort(ids)
    out = grouped(x, x[perm // K], w, ids) * weights[perm, None]
    return out[torch.argsort(perm)].view(T, K, H).sum(1)


def moe_index_add(x, gate, w):
    weights, ids = routing(x, gate)
    ids_sorted, perm = torch.sort(ids)
    out = grouped(x, x[perm // K], w, ids_sorted) * weights[perm].unsqueeze(-1)
    return torch.zeros(T, H).index_add(0, perm // K, out)


def moe_scatter_back(x, gate, w):
    weights, ids = routing(x, gate)
    ids_sorted, perm = torch.sort(ids)
    out = grouped(x, x[perm // K], w, ids_sorted) * weights[perm].unsqueeze(-1)
    back = torch.zeros(T * K, H).index_put((perm,), out)  # each row to where it came from
    return back.view(T, K, H).sum(1)


def moe_batched_gather(x, gate, w):
    """Weights gathered per row by the sorted ids (equal along ties), a batched product."""
    weights, ids = routing(x, gate)
    ids_sorted, perm = torch.sort(ids)
    rows = torch.bmm(x[perm // K].unsqueeze(1), w[ids_sorted]).squeeze(1)
    out = torch.zeros(T * K, H).index_put((perm,), rows * weights[perm, None])
    return out.view(T, K, H).sum(1), ids_sorted * 2


def rows_summed(x, gate, w):
    _, ids = routing(x, gate)
    _, perm = torch.sort(ids)
    rows = x[perm // K]
    return (rows.relu() * 3).sum(0), rows.amax(0), rows.t() @ rows


def rows_in_a_wider_zero_tensor(x, gate, w):
    """Rows written into half of a zero tensor (slice_scatter: a slice's gradient), put back."""
    _, perm = torch.sort(routing(x, gate)[1])
    wide = torch.slice_scatter(torch.zeros(T * K, 2 * H), x[perm // K], 1, 0, H)
    return wide[torch.argsort(perm)]


UNOBSERVABLE = {
    "rows written into a zero tensor": rows_in_a_wider_zero_tensor,
    "grouped, inverse by index_put": moe_grouped,
    "argsort of the permutation, offsets of the unsorted ids": moe_argsort_inverse,
    "index_add by token": moe_index_add,
    "index_put by the permutation": moe_scatter_back,
    "batched, weights gathered by sorted ids": moe_batched_gather,
    "sums and a product over the rows": rows_summed,
}


def leak_permutation(x, gate, w):
    return torch.sort(routing(x, gate)[1])[1]


def leak_rows(x, gate, w):
    _, perm = torch.sort(routing(x, gate)[1])
    return x[perm // K] * 2


def leak_cumsum(x, gate, w):
    _, perm = torch.sort(routing(x, gate)[1])
    return torch.cumsum(x[perm // K], 0)[torch.argsort(perm)]


def leak_position_mix(x, gate, w):
    """Rows added to a tensor of their own positions: the sum depends on who sits where."""
    _, perm = torch.sort(routing(x, gate)[1])
    mixed = x[perm // K] + torch.arange(T * K).unsqueeze(-1)
    return mixed[torch.argsort(perm)]


def leak_offsets_past_low_ids(x, gate, w):
    """histc from 1: expert 0's rows are not counted, so groups no longer start at key changes."""
    weights, ids = routing(x, gate)
    ids_sorted, perm = torch.sort(ids)
    out = grouped(x, x[perm // K], w, ids_sorted, low=1)
    return out[torch.argsort(perm)].view(T, K, H).sum(1)


def leak_descending(x, gate, w):
    """Descending order with ascending offsets: groups straddle ties."""
    weights, ids = routing(x, gate)
    ids_sorted, perm = torch.sort(ids, descending=True)
    out = grouped(x, x[perm // K], w, ids_sorted.flip(0))
    return out[torch.argsort(perm)].view(T, K, H).sum(1)


def leak_last_writer(x, gate, w):
    """index_put without accumulate by token: of a token's rows, the last one written wins."""
    _, perm = torch.sort(routing(x, gate)[1])
    return torch.zeros(T, H).index_put((perm // K,), x[perm // K] * torch.arange(T * K).unsqueeze(-1).float())


def leak_argmax(x, gate, w):
    _, perm = torch.sort(routing(x, gate)[1])
    return torch.argmax(x[perm // K].sum(1))


def leak_first_row(x, gate, w):
    _, perm = torch.sort(routing(x, gate)[1])
    return torch.cat([x[perm // K], x], 0)[0]


def leak_rows_over_positions(x, gate, w):
    """Rows written into half of a tensor whose other half stays where it is."""
    _, perm = torch.sort(routing(x, gate)[1])
    wide = torch.slice_scatter(torch.arange(T * K * 2 * H).float().view(T * K, 2 * H), x[perm // K], 1, 0, H)
    return wide[torch.argsort(perm)]


OBSERVABLE = {
    "rows written over a tensor that stays": leak_rows_over_positions,
    "the permutation": leak_permutation,
    "the sorted rows": leak_rows,
    "a cumulative sum over the rows": leak_cumsum,
    "rows mixed with positions": leak_position_mix,
    "offsets that skip low ids": leak_offsets_past_low_ids,
    "descending sort, ascending offsets": leak_descending,
    "last writer wins": leak_last_writer,
    "argmax over the rows": leak_argmax,
    "a slice of the rows": leak_first_row,
}


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g), torch.randn(H, E, generator=g), torch.randn(E, H, H, generator=g)


def aten_graph(fn, args) -> torch.fx.GraphModule:
    """The inference graph ortlite's backend gets for fn (Dynamo, aot_autograd, ortlite's
    decompositions), its sorts marked."""
    captured = []

    def compiler(gm, example_inputs):
        captured.append(gm)
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=compiler, decompositions=decomposition_table(ortlite.Options().random)), dynamic=False)(*args)
    (gm,) = captured
    mark_tie_orders(gm.graph)
    return gm


class ShuffledTies(torch.fx.Interpreter):
    """Runs a graph with each sort's equal keys in a random order (an order aten may give)."""

    def __init__(self, gm, generator):
        super().__init__(gm)
        self.generator = generator

    def call_function(self, target, args, kwargs):
        if target not in SORTS or target is torch.ops.aten.topk.default:
            return super().call_function(target, args, kwargs)
        keys = args[0]
        descending = kwargs.get("descending", args[2] if len(args) > 2 else False)
        order = shuffled_tie_order(keys, descending, self.generator)
        return keys[order], order


def shuffled_tie_order(row, descending, generator):
    """The sorting order of a 1-D row, each run of equal keys in a random order."""
    values, order = torch.sort(row, stable=True, descending=descending)
    _, counts = torch.unique_consecutive(values, return_counts=True)
    start = 0
    for c in counts.tolist():
        order[start : start + c] = order[start : start + c][torch.randperm(c, generator=generator)]
        start += c
    return order


def changes_with_tie_order(gm, args) -> bool:
    with torch.no_grad():
        runs = [ShuffledTies(gm, torch.Generator().manual_seed(s)).run(*args) for s in range(6)]
    for outs in runs[1:]:
        for got, first in zip(outs, runs[0]):
            if not torch.allclose(got.double(), first.double(), rtol=1e-5, atol=1e-5):
                return True
    return False


def verdicts(gm) -> list:
    return [n.meta[TIE_ORDER] for n in gm.graph.nodes if n.op == "call_function" and n.target is not torch.ops.aten.topk.default and n.target in SORTS]


@pytest.fixture(autouse=True)
def _grouped_mm_registered():
    pytest.importorskip("transformers.integrations.moe", reason="transformers registers the grouped mm op MoE layers use")


@pytest.mark.parametrize("name", sorted(UNOBSERVABLE))
def test_proof_holds_under_every_tie_order(name):
    """The proof finds the order unobservable, and the oracle agrees on several inputs."""
    for seed in range(3):
        args = inputs(seed)
        gm = aten_graph(UNOBSERVABLE[name], args)
        assert verdicts(gm) and all(not v.checked for v in verdicts(gm)), verdicts(gm)
        assert not changes_with_tie_order(gm, args)


@pytest.mark.parametrize("name", sorted(OBSERVABLE))
def test_order_that_reaches_an_output_keeps_its_check(name):
    """The oracle sees the outputs change with the tie order; the proof must not claim
    otherwise (the sort keeps its per-call check)."""
    args = inputs(0)
    gm = aten_graph(OBSERVABLE[name], args)
    assert changes_with_tie_order(gm, args), "the program does not show its tie order: a useless case"
    assert any(v.checked for v in verdicts(gm)), verdicts(gm)


@pytest.mark.parametrize("name", sorted(UNOBSERVABLE))
def test_unobservable_orders_run_whole_in_ort(name):
    fn = UNOBSERVABLE[name]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    with torch.no_grad():
        for seed in range(3):
            args = inputs(seed)
            torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == 1


@pytest.mark.parametrize("name", ["the permutation", "a cumulative sum over the rows", "last writer wins"])
def test_observable_orders_still_leave_to_torch(name):
    fn = OBSERVABLE[name]
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    with torch.no_grad():
        args = inputs(0)
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert "aten.sort.default" in backend.stats.fallback_ops
    with pytest.raises(ortlite.RunError, match="equal values"):  # ahead of time: raised, as before
        ortlite.compile(Wrap(fn), args)(*args)




def test_training_step_proves_on_the_joint_graph():
    """Under autograd, the forward saves the permutation for the backward: judged alone, the
    forward's sort would reach an output. The joint graph is judged whole, before it is cut."""
    x, gate, w = inputs(0)
    params = [p.requires_grad_() for p in (x.clone(), gate.clone(), w.clone())]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(moe_grouped, backend=backend, dynamic=False)
    compiled(*params).square().sum().backward()
    reference = [p.detach().clone().requires_grad_() for p in (x, gate, w)]
    moe_grouped(*reference).square().sum().backward()
    for got, expected in zip(params, reference):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-5)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == 2


def test_explain_says_for_each_sort_whether_ties_are_checked_and_why():
    args = inputs(0)
    with torch.no_grad():
        proven = str(ortlite.explain(moe_grouped, *args))
        leaking = str(ortlite.explain(leak_permutation, *args))
    assert "unchecked: tie order unobservable" in proven and "put back in order" in proven
    assert "checked per call" in leaking and "reaches graph output" in leaking
    compiled = ortlite.compile(Wrap(moe_grouped), args)
    assert "unchecked: tie order unobservable" in str(ortlite.explain(compiled))


def test_proof_work_is_linear_in_depth():
    """Each sort's proof visits only the region its order travels (until the rows are put
    back): the work per layer stays the same however deep the stack of MoE layers."""
    from ortlite.lower.tie_order import _Analysis

    def stack(depth):
        def fn(x, gate, w):
            for _ in range(depth):
                x = x + moe_grouped(x, gate, w)
            return x

        return fn

    per_layer = {}
    for depth in (2, 4, 8):
        gm = aten_graph(stack(depth), inputs(0))
        positions = {n: i for i, n in enumerate(gm.graph.nodes)}
        sorts = [n for n in gm.graph.nodes if n.target is torch.ops.aten.sort.default]
        assert len(sorts) == depth
        work = 0
        for sort in sorts:
            analysis = _Analysis(sort, positions)
            assert analysis.run() is None
            work += analysis.visited
        per_layer[depth] = work / depth
    assert per_layer[2] == per_layer[4] == per_layer[8], per_layer


# --- keys of any rank: all positions of the axis, read only by scatters of one value --------

B, S = 2, 6


def tied_scores(seed: int):
    """(B, S, S) scores with many ties: small integers, and -inf above the diagonal (causal)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (B, S, S), generator=g).float()
    return (scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf")),)


def indexer_mask(scores):
    """DeepSeek's sparse-attention indexer: the top positions (here all of them) scattered as
    False into a mask of ones, which then masks the scores."""
    idx = scores.topk(S, dim=-1).indices.to(torch.int32)
    mask = idx.new_ones((B, S, S), dtype=torch.bool).scatter(-1, idx.long(), False)
    return scores.masked_fill(mask, -1e4).softmax(-1)


def argsort_rows_marked(scores):
    order = torch.argsort(scores, dim=1)
    return torch.zeros(B, S, S).scatter(1, order, 1.0) + scores.clamp(min=0)


SCATTERED_WHOLE = {"indexer mask (topk of all, a scatter of False)": indexer_mask, "argsort along dim 1, a scatter of 1.0": argsort_rows_marked}


def leak_topk_some(scores):
    """topk of fewer than all: which of the tied keys are chosen decides the mask."""
    idx = scores.topk(3, dim=-1).indices
    return torch.zeros(B, S, S).scatter(-1, idx, 1.0)


def leak_scatter_of_positions(scores):
    """A scatter of values that differ (src): who lands where depends on the order."""
    idx = scores.topk(S, dim=-1).indices
    return torch.zeros(B, S, S).scatter(-1, idx, torch.arange(S, dtype=torch.float).expand(B, S, S).contiguous())


def leak_indices_too(scores):
    idx = scores.topk(S, dim=-1).indices
    return torch.zeros(B, S, S).scatter(-1, idx, 1.0), idx


def leak_scatter_along_another_axis(scores):
    idx = torch.argsort(scores, dim=-1)
    return torch.zeros(B, S, S).scatter(1, idx, 1.0)


SCATTERED_OBSERVABLE = {
    "topk of fewer than all": leak_topk_some,
    "a scatter of positions": leak_scatter_of_positions,
    "the indices returned too": leak_indices_too,
    "scattered along another axis": leak_scatter_along_another_axis,
}


class ShuffledTiesAnyRank(torch.fx.Interpreter):
    """Runs a graph with each sort's or topk's equal keys, in every row along its axis, in a
    random order (then topk's first k): an order, and for topk a choice, aten may give."""

    def __init__(self, gm, generator):
        super().__init__(gm)
        self.generator = generator

    def call_function(self, target, args, kwargs):
        if target not in SORTS:
            return super().call_function(target, args, kwargs)
        keys = args[0]
        if target is torch.ops.aten.topk.default:
            k = args[1]
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            descending = args[3] if len(args) > 3 else kwargs.get("largest", True)
        else:
            k = None
            dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
            descending = args[2] if len(args) > 2 else kwargs.get("descending", False)
        moved = keys.movedim(dim, -1)
        rows = moved.reshape(-1, moved.shape[-1])
        order = torch.stack([shuffled_tie_order(row, descending, self.generator) for row in rows]).reshape(moved.shape)
        if k is not None:
            order = order[..., :k]
        order = order.movedim(-1, dim).contiguous()
        return torch.gather(keys, dim, order), order


def changes_with_tie_order_any_rank(gm, args) -> bool:
    with torch.no_grad():
        runs = [ShuffledTiesAnyRank(gm, torch.Generator().manual_seed(s)).run(*args) for s in range(8)]
    return any(not torch.equal(got, first) for outs in runs[1:] for got, first in zip(outs, runs[0]))


def all_verdicts(gm) -> list:
    return [n.meta[TIE_ORDER] for n in gm.graph.nodes if n.op == "call_function" and n.target in SORTS]


@pytest.mark.parametrize("name", sorted(SCATTERED_WHOLE))
def test_all_positions_scattered_as_one_value_need_no_check(name):
    for seed in range(3):
        args = tied_scores(seed)
        gm = aten_graph(SCATTERED_WHOLE[name], args)
        assert [v.kind for v in all_verdicts(gm)] == ["every position, scattered"], all_verdicts(gm)
        assert not changes_with_tie_order_any_rank(gm, args)


@pytest.mark.parametrize("name", sorted(SCATTERED_OBSERVABLE))
def test_choice_or_order_that_reaches_an_output_keeps_its_check(name):
    args = tied_scores(0)
    gm = aten_graph(SCATTERED_OBSERVABLE[name], args)
    assert changes_with_tie_order_any_rank(gm, args), "the program does not show its ties: a useless case"
    assert all(v.checked for v in all_verdicts(gm)), all_verdicts(gm)


@pytest.mark.parametrize("name", sorted(SCATTERED_WHOLE))
def test_all_positions_scattered_run_whole_torch_compile_and_ahead_of_time(name):
    fn = SCATTERED_WHOLE[name]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    aot = ortlite.compile(Wrap(fn), tied_scores(0))
    with torch.no_grad():
        for seed in range(3):
            args = tied_scores(seed)
            torch.testing.assert_close(compiled(*args), fn(*args))
            torch.testing.assert_close(aot(*args), fn(*args))
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == 1
