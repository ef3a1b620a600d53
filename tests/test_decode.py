"""Decode steps with a static KV cache (ortlite.decode, ortlite.lower.decoder): attention over
the cache becomes GroupQueryAttention only where the graph proves it the same computation,
and the step's tokens, logits and cache buffers are eager's, at every length a loop calls it
with (prompt, one token, a chunk)."""

from __future__ import annotations

import gc
import os

import onnxruntime
import pytest
import torch

import ortlite
import ortlite.decode
from conftest import assert_same

transformers = pytest.importorskip("transformers")


def ops_of(compiled) -> dict:
    counts: dict = {}
    for node in compiled.onnx_model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


class StaticAttention(torch.nn.Module):
    """One attention over a static cache, the way transformers' StaticCache writes it
    (index_copy_ at positions arange(S) + p) and masks it (key j <= position of query i),
    with the variations a fusion must not take for the same thing: `positions` "given" (the
    caller's cache_position, not arange(S) + p), `shift` (keys up to position + shift:
    shift 1 reads a slot not written yet), `window` (a sliding window: keys past
    position - window masked)."""

    def __init__(self, heads=4, kv_heads=2, head=16, length=24, positions="arange", shift=0, window=None, batch=1, functional=False):
        super().__init__()
        torch.manual_seed(0)
        hidden = heads * head
        self.heads, self.kv_heads, self.head = heads, kv_heads, head
        self.q = torch.nn.Linear(hidden, hidden, bias=False)
        self.k = torch.nn.Linear(hidden, kv_heads * head, bias=False)
        self.v = torch.nn.Linear(hidden, kv_heads * head, bias=False)
        self.register_buffer("keys", torch.zeros(batch, kv_heads, length, head))
        self.register_buffer("values", torch.zeros(batch, kv_heads, length, head))
        self.positions, self.shift, self.window, self.length = positions, shift, window, length
        self.functional = functional  # the cache written into new tensors (index_copy), returned: the buffers stay

    def forward(self, x, cache_position):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head).transpose(1, 2)
        positions = torch.arange(s) + cache_position[0] if self.positions == "arange" else cache_position
        if self.functional:
            keys_now, values_now = self.keys.index_copy(2, positions, k), self.values.index_copy(2, positions, v)
        else:
            keys_now, values_now = self.keys.index_copy_(2, positions, k), self.values.index_copy_(2, positions, v)
        keys = torch.arange(self.length)
        allowed = keys[None, :] <= positions[:, None] + self.shift
        if self.window is not None:
            allowed = allowed & (keys[None, :] > positions[:, None] - self.window)
        r = self.heads // self.kv_heads
        kc = keys_now[:, :, None].expand(b, self.kv_heads, r, self.length, self.head).reshape(b, self.heads, self.length, self.head)
        vc = values_now[:, :, None].expand(b, self.kv_heads, r, self.length, self.head).reshape(b, self.heads, self.length, self.head)
        out = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=allowed).transpose(1, 2).reshape(b, s, -1)
        return (out, keys_now * 1, values_now * 1) if self.functional else out


def compile_step(module, batch=1, example=3):
    hidden = module.heads * module.head
    length = torch.export.Dim("length", min=1, max=module.length)
    args = (torch.randn(batch, example, hidden), torch.arange(example))
    with torch.no_grad():
        program = torch.export.export(module, args, dynamic_shapes=({1: length}, {0: length}), strict=True)
        return ortlite.compile(program)


def run_loop(module, compiled, batch=1, calls=((0, 5), (5, 1), (6, 1), (7, 3), (10, 1), (2, 4), (6, 1))):
    """Both through the same calls (start, length), from the same cache; outputs and buffers
    compared after each (the cache from start + length on keeps what earlier calls wrote)."""
    hidden = module.heads * module.head
    eager_buffers = {n: b.clone() for n, b in module.named_buffers()}
    for start, length in calls:
        x = torch.randn(batch, length, hidden)
        positions = torch.arange(start, start + length)
        with torch.no_grad():
            got = compiled(x, positions)
            for n, b in module.named_buffers():
                b.copy_(eager_buffers[n])
            expected = module(x, positions)
            eager_buffers = {n: b.clone() for n, b in module.named_buffers()}
        assert_same(got, expected, rtol=1e-5, atol=1e-5)
        for name, b in module.named_buffers():  # (a functional step leaves its buffers as they were)
            if not compiled._mutations:
                assert torch.equal(compiled._buffers[name], eager_buffers[name])
        for tensor, target in zip(ortlite.decode.cache_tensors(compiled), [t for _, t in compiled._mutations]):
            assert_same(tensor, eager_buffers[target], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "variant, fused",
    [
        (dict(), True),
        (dict(kv_heads=4), True),  # as many kv heads as query heads
        (dict(positions="given"), False),  # written where the caller says: not arange(S) + p
        (dict(shift=1), False),  # a key not written yet is seen
        (dict(window=3), False),  # a sliding window
        (dict(head=12), False),  # GroupQueryAttention takes head sizes of multiples of 8
        (dict(batch=2), False),  # its kernel takes S > 1 with a past for one sequence alone
        (dict(functional=True), True),  # new tensors, returned: fused, but not written into the buffers
    ],
)
def test_static_cache_attention_only_where_proven(variant, fused):
    module = StaticAttention(**variant).eval()
    batch = variant.get("batch", 1)
    compiled = compile_step(module, batch)
    ops = ops_of(compiled)
    assert ops.get("GroupQueryAttention", 0) == (1 if fused else 0), ops
    if fused:
        assert "ScatterElements" not in ops and "If" not in ops and "Attention" not in ops, ops
    # in place: GroupQueryAttention's present key and value, or the ScatterElements left, where
    # they are the buffers' new values (not the new tensors a functional index_copy returns)
    assert len(compiled._lowered.inplace) == (0 if variant.get("functional") else 2), compiled._lowered.inplace
    calls = ((0, 5), (5, 1), (6, 3), (9, 1), (3, 2), (5, 1)) if variant.get("positions") != "given" else ((0, 5), (5, 1), (6, 2))
    buffers = [b.clone() for b in module.buffers()]
    run_loop(module, compiled, batch, calls)
    if variant.get("functional"):
        assert all(torch.equal(a, b) for a, b in zip(buffers, module.buffers()))


@pytest.mark.parametrize("start, length", [(22, 3), (24, 1), (-1, 2)])
def test_static_cache_positions_outside_raise(start, length):
    """Cache positions outside [0, L) raise as eager's index_copy_ does (the kernel, given a
    clamped position, stays within its buffers)."""
    module = StaticAttention().eval()
    compiled = compile_step(module)
    x = torch.randn(1, length, 64)
    with pytest.raises((RuntimeError, IndexError)) as eager:
        with torch.no_grad():
            module(x, torch.arange(start, start + length))
    with pytest.raises(eager.type, match="index"):  # eager's error type
        compiled(x, torch.arange(start, start + length))
    compiled(torch.randn(1, 2, 64), torch.arange(3, 5))  # and it runs on


def tiny_llama(**overrides):
    torch.manual_seed(0)
    config = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    config.update(overrides)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval().requires_grad_(False)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("rope", [None, {"rope_type": "linear", "factor": 2.0}])
def test_llama_static_cache_step_generates_eager_tokens(rope):
    """transformers' exportable static-cache step: GroupQueryAttention in every layer, rotary
    inside it (tables of the cache's positions, also for a scaled rope), the tokens of eager
    generate (dynamic cache) for prompts of several lengths in turn, the caches eager's own
    wrapper leaves (where both wrote; stale rows kept), and over a few hundred steps the same
    cache memory and no memory growth."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model = tiny_llama(**({"rope_scaling": rope} if rope else {}))
    length = 40
    step = ortlite.decode.compile_static_cache_step(model, length)
    assert step.decode is None  # (float32: one graph for every length)
    ops = ops_of(step.prompt)
    assert ops.get("GroupQueryAttention") == 2 and ops.get("SkipSimplifiedLayerNormalization") == 4, ops
    assert "ScatterElements" not in ops and "If" not in ops and "RotaryEmbedding" not in ops, ops
    assert all(any(a.name == "do_rotary" and a.i == 1 for a in n.attribute) for n in step.prompt.onnx_model.graph.node if n.op_type == "GroupQueryAttention")
    model.generation_config.cache_implementation = "static"
    eager_step = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=length)
    model.generation_config.cache_implementation = None
    torch.manual_seed(1)
    for prompt, new in ((7, 20), (3, 9), (12, 15)):
        ids = torch.randint(3, 256, (1, prompt))
        with torch.no_grad():
            expected = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)[0, prompt:]
            assert torch.equal(ortlite.decode.generate(step, ids, new)[0], expected)
            # eager's wrapper through the same calls, the prompt in two chunks: logits and caches
            position = 0
            tokens = [ids[:, : prompt // 2], ids[:, prompt // 2 :]] + [expected[i].view(1, 1) for i in range(new - 1)]
            for chunk in tokens:
                positions = torch.arange(position, position + chunk.shape[1])
                assert_same(step(input_ids=chunk, cache_position=positions), eager_step(input_ids=chunk, cache_position=positions)[:, -1:], rtol=1e-4, atol=1e-5)
                position += chunk.shape[1]
            buffers = dict(eager_step.named_buffers())
            for tensor, target in zip(ortlite.decode.cache_tensors(step), [t for _, t in step.prompt._mutations]):
                assert_same(tensor, buffers[target], rtol=1e-5, atol=1e-6)
    pointers = [t.data_ptr() for t in ortlite.decode.cache_tensors(step)]
    ids = torch.randint(3, 256, (1, 4))
    sizes = []
    for _ in range(10):
        ortlite.decode.generate(step, ids, 30)
        gc.collect()
        sizes.append(rss_mb())
    assert pointers == [t.data_ptr() for t in ortlite.decode.cache_tensors(step)]
    assert sizes[-1] - sizes[2] < 2, sizes


def test_generate_stops_at_eos():
    model = tiny_llama()
    step = ortlite.decode.compile_static_cache_step(model, 32)
    ids = torch.randint(3, 256, (1, 5))
    tokens = ortlite.decode.generate(step, ids, 12)
    eos = int(tokens[0, 3])
    first = int((tokens[0] == eos).nonzero()[0])
    stopped = ortlite.decode.generate(step, ids, 12, eos_token_id=eos)
    assert torch.equal(stopped[0], tokens[0, : first + 1])


def test_cache_written_in_place_and_saved(tmp_path):
    """The runner binds GroupQueryAttention's present key and value to the cache buffers'
    memory, and the length counters' new values to theirs: the values it returns for the
    mutations are the buffers themselves (no copy per step). A saved step loads with that
    binding and generates the same."""
    model = tiny_llama()
    step = ortlite.decode.compile_static_cache_step(model, 32).prompt
    # the key and value caches of both layers, and their length counters (set, never read)
    assert len(step._lowered.inplace) == 6, step._lowered.inplace
    results = ortlite._fast.Runner.__call__(step, *step._weights, torch.randint(3, 256, (1, 4)), torch.arange(4))
    written = [(target, value) for (_, target), value in zip(step._mutations, results)]
    assert len(written) == 6 and all(value is step._buffers[target] for target, value in written), written
    ids = torch.randint(3, 256, (1, 6))
    expected = ortlite.decode.generate(step, ids, 10)
    step.save(tmp_path / "step.onnx")
    loaded = ortlite.load(tmp_path / "step.onnx")
    assert loaded._lowered.inplace == step._lowered.inplace
    assert torch.equal(ortlite.decode.generate(loaded, ids, 10), expected)


@pytest.mark.parametrize("quantize", [None, "int4"])
def test_saved_step_pair_loads_into_one_step(tmp_path, quantize):
    """A step with a one-token graph of its own saves as two files; loaded and joined by
    StaticCacheStep (as bench/aot_worker.py does), the two graphs write one set of buffers and
    generate the compiled step's tokens, prompt after prompt."""
    model = tiny_llama()
    step = ortlite.decode.compile_static_cache_step(model, 32, separate_decode=True, options={"quantize": quantize})
    step.prompt.save(tmp_path / "prompt.onnx")
    step.decode.save(tmp_path / "decode.onnx")
    loaded = ortlite.decode.StaticCacheStep(ortlite.load(tmp_path / "prompt.onnx"), ortlite.load(tmp_path / "decode.onnx"))
    for target, tensor in loaded.prompt._buffers.items():
        assert loaded.decode._buffers[target] is tensor
    for length in (5, 9, 3):
        ids = torch.randint(3, 256, (1, length))
        assert torch.equal(ortlite.decode.generate(loaded, ids, 12), ortlite.decode.generate(step, ids, 12))

@pytest.mark.parametrize("quantize", [None, "int4"])
def test_separate_decode_graph(quantize):
    """One token runs a static graph of its own beside the prompt's (S >= 2): both write the
    same buffers; float32 generates eager's tokens through both; with int4 the one-token
    graph takes the 4-bit kernel and the prompt's the 8-bit one (its rows are at least 2),
    neither choosing per call (no If)."""
    model = tiny_llama()
    step = ortlite.decode.compile_static_cache_step(model, 32, separate_decode=True, options={"quantize": quantize})
    for target, tensor in step.prompt._buffers.items():
        assert step.decode._buffers[target] is tensor
    decode_ops, prompt_ops = ops_of(step.decode), ops_of(step.prompt)
    assert "If" not in decode_ops and "If" not in prompt_ops, (decode_ops, prompt_ops)
    ids = torch.randint(3, 256, (1, 5))
    tokens = ortlite.decode.generate(step, ids, 12)
    if quantize is None:
        with torch.no_grad():
            assert torch.equal(tokens, model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)[:, 5:])
    else:
        # q, k, v packed into one product: 5 a layer and the LM head (the prompt's LM head has
        # one row too: its last position's)
        assert decode_ops.get("MatMulNBits") == 11 and prompt_ops.get("MatMulNBits") == 1, (decode_ops, prompt_ops)
        assert tokens.shape == (1, 12)


class SharedInput(torch.nn.Module):
    """Five linears of one input (odd widths), one of them read by another product, one whose
    weight is read elsewhere too: packed by fours, the values as eager's, at changing sizes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linears = torch.nn.ModuleList(torch.nn.Linear(48, n, bias=False) for n in (16, 24, 40, 8, 31))
        self.other = torch.nn.Linear(31, 5, bias=False)

    def forward(self, x):
        outs = [lin(x) for lin in self.linears]
        return torch.cat(outs[:4], -1).sum(-1, keepdim=True) * self.other(outs[4]) + x @ self.linears[0].weight.t().sum(-1, keepdim=True)


def test_packed_products_match_eager(monkeypatch):
    """Packed products give eager's values, and bit for bit the values of the graph without
    packing (each column the same dot product)."""
    import ortlite.lower
    from ortlite.lower import decoder

    model = SharedInput().eval()
    x = torch.randn(2, 7, 48)
    batch, length = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("length", min=1, max=64)
    with torch.no_grad():
        with monkeypatch.context() as m:  # (compiles pack q, k and v for GroupQueryAttention alone: every product here)
            m.setattr(ortlite.lower, "static_cache_attention", lambda *a: 1)
            m.setattr(ortlite.lower, "packed_products", lambda graph, known, into=None, frozen=frozenset(): decoder.packed_products(graph, known, frozen=frozen))
            compiled = ortlite.compile(model, (x,), dynamic_shapes=({0: batch, 1: length},))
        unpacked = ortlite.compile(model, (x,), dynamic_shapes=({0: batch, 1: length},))
    assert "Split" not in ops_of(unpacked)
    ops = ops_of(compiled)
    # x's five products by constant weights: four packed, one alone; x @ (a weight's sum) and other(...) as they were
    assert ops.get("Split") == 1 and ops["MatMul"] == 4, ops
    for shape in ((2, 7, 48), (1, 1, 48), (3, 33, 48)):
        x = torch.randn(shape)
        with torch.no_grad():
            got = compiled(x)
            assert_same(got, model(x), rtol=1e-5, atol=1e-5)
            assert torch.equal(got, unpacked(x))


def test_packed_frozen_products_match_eager(monkeypatch):
    """Under torch.compile (weights frozen at session build, graph inputs when lowered): products
    packed by a Concat of their weights, which ONNX Runtime folds; eager's values, bit for bit
    the unpacked graph's; with the weights bound (freeze_weights=False) nothing is packed."""
    import ortlite.lower
    from ortlite.lower import decoder

    model = SharedInput().eval()
    seen = []

    def packing(graph, known, into=None, frozen=frozenset()):
        seen.append(decoder.packed_products(graph, known, frozen=frozen))
        return seen[-1]

    with torch.no_grad():
        with monkeypatch.context() as m:
            m.setattr(ortlite.lower, "static_cache_attention", lambda *a: 1)
            m.setattr(ortlite.lower, "packed_products", packing)
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=ortlite.Backend(ortlite.Options(fallback="error")))
            x = torch.randn(2, 7, 48)
            got = compiled(x)
            bound = torch.compile(copy_module(model), backend=ortlite.Backend(ortlite.Options(fallback="error", freeze_weights=False)))
            got_bound = bound(x)
        assert seen == [4, 0], seen  # frozen: four products packed; bound: none
        unpacked = torch.compile(copy_module(model), backend=ortlite.Backend(ortlite.Options(fallback="error")))
        assert_same(got, model(x), rtol=1e-5, atol=1e-5)
        assert torch.equal(got, unpacked(x))  # (bound weights run other kernels than frozen ones: eager's values within rounding)
        assert_same(got_bound, model(x), rtol=1e-5, atol=1e-5)


def copy_module(model):
    import copy

    return copy.deepcopy(model)


class WriteRows(torch.nn.Module):
    """A cache the caller owns, written at rows start.. (a user input the program mutates)."""

    def forward(self, cache, x, start):
        cache.index_copy_(0, torch.arange(x.shape[0]) + start[0], x)
        return cache.sum(0)


write_rows = WriteRows()


def test_user_cache_written_in_place():
    """A user input the program mutates is written in place (ScatterElements into its memory):
    the caller's tensor holds eager's values after each call; a non-contiguous one (a view)
    gets a copy of its own bound as both, copied back as before."""
    cache, x = torch.zeros(10, 6), torch.randn(3, 6)
    compiled = ortlite.compile(write_rows, (cache.clone(), x, torch.tensor([2])))
    assert len(compiled._lowered.inplace) == 1, compiled._lowered.inplace
    eager = cache.clone()
    for start in (0, 4, 7, 1):
        x = torch.randn(3, 6)
        expected = write_rows(eager, x, torch.tensor([start]))
        pointer = cache.data_ptr()
        assert_same(compiled(cache, x, torch.tensor([start])), expected, rtol=1e-6, atol=1e-6)
        assert torch.equal(cache, eager) and cache.data_ptr() == pointer
    base = torch.zeros(6, 10)
    view, eager = base.t(), torch.zeros(10, 6)
    for start in (0, 5):
        x = torch.randn(3, 6)
        expected = write_rows(eager, x, torch.tensor([start]))
        assert_same(compiled(view, x, torch.tensor([start])), expected, rtol=1e-6, atol=1e-6)
        assert torch.equal(view, eager)


def test_generate_static_cache_under_torch_compile(monkeypatch):
    """HF generate with a static cache and forward compiled by ortlite: eager's tokens, run
    after run, and the one-token graph writes the cache buffers (arguments it mutates) in
    place (aot_autograd's metadata names them)."""
    import ortlite.runner

    pairs = []
    real = ortlite.runner.inplace_pairs
    monkeypatch.setattr(ortlite.runner, "inplace_pairs", lambda lowered, frozen=frozenset(): pairs.append(real(lowered, frozen)) or pairs[-1])
    model = tiny_llama()
    ids = torch.randint(3, 256, (1, 6))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend=ortlite.Backend(ortlite.Options(fallback="error")))
        for _ in range(2):
            assert torch.equal(model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, cache_implementation="static"), expected)
    assert any(len(p) == 4 for p in pairs), pairs  # the key and value caches of both layers


class MaskedCacheAttention(StaticAttention):
    """StaticAttention with the mask an argument (as HF generate passes a static cache's)."""

    def forward(self, x, cache_position, allowed):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head).transpose(1, 2)
        positions = torch.arange(s) + cache_position[0]
        self.keys.index_copy_(2, positions, k)
        self.values.index_copy_(2, positions, v)
        r = self.heads // self.kv_heads
        kc = self.keys[:, :, None].expand(b, self.kv_heads, r, self.length, self.head).reshape(b, self.heads, self.length, self.head)
        vc = self.values[:, :, None].expand(b, self.kv_heads, r, self.length, self.head).reshape(b, self.heads, self.length, self.head)
        out = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=allowed)
        return out.transpose(1, 2).reshape(b, s, -1)


def test_mask_argument_checked_per_call(tmp_path):
    """A static cache's causal mask passed as an argument: GroupQueryAttention with a check per
    call that the mask is the causal mask of the cache positions; a call with another mask
    (a padding mask) fails that check and the attention runs in torch, eager's result."""
    module = MaskedCacheAttention().eval()
    eager_module = MaskedCacheAttention().eval()
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(dump_dir=str(tmp_path)))
    compiled = torch.compile(module, backend=backend)

    def causal(start, length):
        return (torch.arange(24)[None, :] <= torch.arange(start, start + length)[:, None])[None, None]

    with torch.no_grad():
        for start, length, padded in ((0, 5, False), (5, 1, False), (6, 1, False), (7, 1, True), (8, 1, False)):
            x = torch.randn(1, length, 64)
            mask = causal(start, length)
            if padded:
                mask = mask.clone()
                mask[..., 1] = False
            positions = torch.arange(start, start + length)
            assert_same(compiled(x, positions, mask), eager_module(x, positions, mask), rtol=1e-5, atol=1e-5)
            assert_same(module.keys, eager_module.keys, rtol=1e-6, atol=1e-6)
            sdpa = "aten._scaled_dot_product_flash_attention_for_cpu.default"
            assert (sdpa in backend.stats.fallback_ops) == (padded or start > 7), backend.stats.fallback_ops
    import onnx

    ops = {n.op_type for p in tmp_path.glob("*.onnx") for n in onnx.load(p).graph.node}
    assert "GroupQueryAttention" in ops, ops


class CountedCacheLayers(torch.nn.Module):
    """Two attentions over static caches, each written at arange(S) + its own length counter (a
    buffer advanced by S per call, as transformers' StaticCache keeps one per layer), the mask an
    argument (as HF generate passes it)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([MaskedCacheAttention() for _ in range(2)])
        for layer in self.layers:
            layer.register_buffer("written", torch.tensor(0))
        head = self.layers[0].head
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head)), persistent=False)

    def forward(self, x, allowed, position_ids=None):
        """position_ids (1, S): q and k rotated at them (transformers' rotary embedding)."""
        if position_ids is not None:
            freqs = position_ids[..., None].float() * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[:, None], emb.sin()[:, None]

            def rotate(t):
                half = t.shape[-1] // 2
                return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

        for layer in self.layers:
            b, s, _ = x.shape
            q = layer.q(x).view(b, s, layer.heads, layer.head).transpose(1, 2)
            k = layer.k(x).view(b, s, layer.kv_heads, layer.head).transpose(1, 2)
            v = layer.v(x).view(b, s, layer.kv_heads, layer.head).transpose(1, 2)
            if position_ids is not None:
                q, k = rotate(q), rotate(k)
            positions = torch.arange(s) + layer.written
            layer.written.add_(s)
            layer.keys.index_copy_(2, positions, k)
            layer.values.index_copy_(2, positions, v)
            r = layer.heads // layer.kv_heads
            kc = layer.keys[:, :, None].expand(b, layer.kv_heads, r, layer.length, layer.head).reshape(b, layer.heads, layer.length, layer.head)
            vc = layer.values[:, :, None].expand(b, layer.kv_heads, r, layer.length, layer.head).reshape(b, layer.heads, layer.length, layer.head)
            out = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=allowed)
            x = x + out.transpose(1, 2).reshape(b, s, -1)
        return x


def _counted_layers_against_eager(tmp_path, arguments, before=None):
    """CountedCacheLayers compiled by ortlite (graphs dumped to tmp_path) and eager, called in
    turn with a 5-token prompt and four single tokens: outputs and buffers equal eager's at
    every call. arguments(i, start, length): the call's arguments; before(i, modules): run
    before call i. Returns the backend and the dumped graphs with GroupQueryAttention in both
    layers, oldest first."""
    import onnx

    module, eager_module = CountedCacheLayers().eval(), CountedCacheLayers().eval()
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(dump_dir=str(tmp_path)))
    compiled = torch.compile(module, backend=backend)
    start = 0
    with torch.no_grad():
        for i, length in enumerate((5, 1, 1, 1, 1)):
            if before is not None:
                before(i, (module, eager_module))
            args = arguments(i, start, length)
            assert_same(compiled(*args), eager_module(*args), rtol=1e-5, atol=1e-5)
            for a, b in zip(module.buffers(), eager_module.buffers()):
                assert_same(a, b, rtol=1e-6, atol=1e-6)
            start += length
    models = [onnx.load(p) for p in sorted(tmp_path.glob("*.onnx"), key=os.path.getmtime)]
    decode = [m for m in models if sum(n.op_type == "GroupQueryAttention" for n in m.graph.node) == 2]
    assert decode, [sorted({n.op_type for n in m.graph.node}) for m in models]
    return backend, decode


def _causal_mask(start, length):
    return (torch.arange(24)[None, :] <= torch.arange(start, start + length)[:, None])[None, None]


@pytest.mark.parametrize("skew", [False, True])
def test_cache_offsets_read_as_one_checked_per_call(tmp_path, skew):
    """Caches written at arange(S) + a counter of their own (one per layer, arguments under
    torch.compile): the later counters are read as the first, with one check per call that they
    are equal, and each layer's position, mask and length checks are kept once; the values are
    eager's. skew: a counter that differs from the first fails the check, and the cache writes
    run in torch from then on, eager's values all the same."""

    def before(i, modules):
        if skew and i == 3:  # the second layer's counter one ahead of the first's
            for m in modules:
                m.layers[1].written.add_(1)

    backend, decode = _counted_layers_against_eager(tmp_path, lambda i, start, length: (torch.randn(1, length, 64), _causal_mask(start, length)), before)
    index_copy = "aten.index_copy.default"
    assert (index_copy in backend.stats.fallback_ops) == skew, backend.stats.fallback_ops
    outputs = [o.name for o in decode[0].graph.output]
    assert sum(n.name.endswith("_offsets_equal") for n in decode[0].graph.node) == 1  # one check of the counters
    assert sum(o.startswith("reducemax") for o in outputs) == 1, outputs  # the positions' range checked once
    assert sum(o.endswith("_not_causal") for o in outputs) == 1, outputs  # the mask checked once, not per layer


@pytest.mark.parametrize("shifted", [False, True])
def test_given_rotary_positions_read_as_cache_positions(tmp_path, shifted):
    """Rotary positions given as an argument (HF generate's position_ids) beside per-layer cache
    counters: read as arange(S) + the counter, checked per call, so q, k and v come from one
    product of the frozen weights (a Concat ONNX Runtime folds) and GroupQueryAttention rotates
    them itself, from tables computed from the frozen inv_freq; eager's values. shifted: positions
    one ahead of the cache's fail the check before any cache write, and the rotary tables (cos)
    run in torch from then on, eager's values all the same."""
    import onnx

    def arguments(i, start, length):
        positions = torch.arange(start, start + length)[None] + (1 if shifted and i == 3 else 0)
        return torch.randn(1, length, 64), _causal_mask(start, length), positions

    backend, decode = _counted_layers_against_eager(tmp_path, arguments)
    assert ("aten.cos.default" in backend.stats.fallback_ops) == shifted, backend.stats.fallback_ops
    assert "aten.index_copy.default" not in backend.stats.fallback_ops, backend.stats.fallback_ops
    nodes = decode[0].graph.node
    attention = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert all(onnx.helper.get_attribute_value(a) == 1 for n in attention for a in n.attribute if a.name == "do_rotary"), attention
    assert all(n.input[1] == "" and n.input[2] == "" for n in attention)  # q, k and v packed
    assert sum(n.op_type == "MatMul" for n in nodes) == 2, [n.op_type for n in nodes]  # one product of q, k and v per layer
    assert not any(n.op_type == "RotaryEmbedding" for n in nodes)
    if shifted:  # compiled again with the rotary tables in torch: the offsets still read as one
        retry = decode[-1].graph.node
        assert not any(n.op_type == "Cos" for n in retry) and sum(n.name.endswith("_offsets_equal") for n in retry) == 1


def _unread_initializers(model) -> list:
    from ortlite.lower.fusions import _reads

    graph = model.graph
    read = set().union(*(_reads(n) for n in graph.node)) | {o.name for o in graph.output} | {i.name for i in graph.input}
    return [t.name for t in graph.initializer if t.name not in read]


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
def test_decode_steps_keep_stderr_quiet_with_the_users_session_options(tmp_path, capfd, quantize):
    """The decoder rewrites leave no initializer that no node reads (ONNX Runtime warns on
    stderr for each at load): ahead of time, saved and loaded in plain onnxruntime, and under
    torch.compile with a static cache, all with a user's SessionOptions (ORT's default log
    level); the tokens stay eager's (float32) / run (quantized)."""
    so = onnxruntime.SessionOptions()
    model = tiny_llama()
    ids = torch.randint(3, 256, (1, 5))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    step = ortlite.decode.compile_static_cache_step(model, 24, options={"session_options": so, "quantize": quantize})
    tokens = ortlite.decode.generate(step, ids, 6)
    if quantize is None:
        assert torch.equal(tokens[0], expected[0, 5:])
    for graph in (step.prompt, step.decode):
        if graph is not None:
            assert not _unread_initializers(graph.onnx_model)
    step.prompt.save(tmp_path / "step.onnx")
    loaded = ortlite.load(tmp_path / "step.onnx", options={"session_options": so})
    assert_same(loaded(input_ids=ids, cache_position=torch.arange(5)), step(input_ids=ids, cache_position=torch.arange(5)))
    if quantize is None:
        torch._dynamo.reset()
        with torch.no_grad():
            model.forward = torch.compile(model.forward, backend=ortlite.Backend(ortlite.Options(session_options=so)))
            assert torch.equal(model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, cache_implementation="static"), expected)
    assert "onnxruntime" not in capfd.readouterr().err
    # plain onnxruntime: no unread initializer (the cache buffers, inputs with their initial
    # values as defaults, are warned about as such: the saved format's choice)
    onnxruntime.InferenceSession(str(tmp_path / "step.onnx"), providers=["CPUExecutionProvider"])
    assert "not used by any node" not in capfd.readouterr().err
