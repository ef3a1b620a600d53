"""What the held-out vision models (torchvision Swin-T, MaxViT-T, RAFT-small, Faster R-CNN;
timm Twins-SVT) do with symbolic sizes, in plain torch ops: windows rolled and partitioned
through floor-divided sizes (padded to a multiple of the window where it does not divide),
grid partitions, relative position biases, a shifted-window mask written through slices,
patch merging, strided sub-sampled attention, correlation pyramids, convex upsampling, and a
detection head's box decoding, clipping to the image size and filtering. Each an eval module
compiled with dynamic=True and called under no_grad with changing sizes (at most a few
compiles: Dynamo's tracing of these with symbolic sizes is what costs), against eager.
bench/vision_models.py runs the models themselves where torchvision is installed."""

import math

import torch
import torch.nn.functional as F

import ortlite
from conftest import assert_same

torch.manual_seed(0)


def _compile_loop(fn, make_args, sizes, atol=1e-5, rtol=1e-4, allowed_fallbacks=()):
    """fn: an eval nn.Module (its sizes and heads int attributes, its weights parameters, as
    the models have them: Dynamo keeps those static), called under no_grad (frozen weights)."""
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for size in sizes:
        args = make_args(*size)
        with torch.no_grad():
            assert_same(compiled(*args), fn(*args), atol=atol, rtol=rtol)
    assert set(backend.stats.fallback_ops) <= set(allowed_fallbacks), [r.torch_ops for r in backend.graph_reports]
    assert backend.stats.runs >= len(sizes)
    return backend


# -- Swin: shifted windows --------------------------------------------------------


def _window_attention(x, qkv_w, proj_w, bias_table, window, shift, heads):
    """torchvision's shifted_window_attention, in its own ops (sizes from x.shape)."""
    B, H, W, C = x.shape
    pad_r = (window - W % window) % window
    pad_b = (window - H % window) % window
    x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
    _, pH, pW, _ = x.shape
    shift_h = 0 if window >= pH else shift
    shift_w = 0 if window >= pW else shift
    if shift_h + shift_w > 0:
        x = torch.roll(x, shifts=(-shift_h, -shift_w), dims=(1, 2))
    n_windows = (pH // window) * (pW // window)
    x = x.view(B, pH // window, window, pW // window, window, C)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(B * n_windows, window * window, C)
    qkv = F.linear(x, qkv_w).reshape(x.size(0), x.size(1), 3, heads, C // heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0] * (C // heads) ** -0.5, qkv[1], qkv[2]
    attn = q.matmul(k.transpose(-2, -1)) + bias_table
    if shift_h + shift_w > 0:
        mask = x.new_zeros((pH, pW))
        count = 0
        for h in ((0, -window), (-window, -shift_h), (-shift_h, None)):
            for w in ((0, -window), (-window, -shift_w), (-shift_w, None)):
                mask[h[0] : h[1], w[0] : w[1]] = count
                count += 1
        mask = mask.view(pH // window, window, pW // window, window).permute(0, 2, 1, 3).reshape(n_windows, window * window)
        mask = mask.unsqueeze(1) - mask.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        attn = attn.view(x.size(0) // n_windows, n_windows, heads, x.size(1), x.size(1)) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, heads, x.size(1), x.size(1))
    x = attn.softmax(-1).matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), C)
    x = F.linear(x, proj_w)
    x = x.view(B, pH // window, pW // window, window, window, C).permute(0, 1, 3, 2, 4, 5).reshape(B, pH, pW, C)
    if shift_h + shift_w > 0:
        x = torch.roll(x, shifts=(shift_h, shift_w), dims=(1, 2))
    return x[:, :H, :W, :].contiguous()


def _patch_merging(x):
    H, W, _ = x.shape[-3:]
    x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
    return torch.cat([x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], x[..., 0::2, 1::2, :], x[..., 1::2, 1::2, :]], -1)


class SwinBlock(torch.nn.Module):
    def __init__(self, C=8, heads=2, window=4, shift=2):
        super().__init__()
        self.heads, self.window, self.shift, self.C = heads, window, shift, C
        self.qkv = torch.nn.Parameter(torch.randn(3 * C, C) / C**0.5)
        self.proj = torch.nn.Parameter(torch.randn(C, C) / C**0.5)
        self.bias = torch.nn.Parameter(torch.randn(heads, window * window, window * window))
        self.norm = torch.nn.LayerNorm(C)

    def forward(self, x):
        y = x + _window_attention(self.norm(x), self.qkv, self.proj, self.bias, self.window, self.shift, self.heads)
        return _patch_merging(y)


def test_swin_shifted_windows_over_changing_sizes():
    # shifted (rolled, masked) windows and patch merging; sizes the windows divide (padded
    # windows, as in Twins below, cost a slow Dynamo trace here: one compile is ~10 s)
    sizes = [(2, 12, 12), (3, 16, 16), (2, 20, 20)]
    _compile_loop(SwinBlock().eval(), lambda b, h, w: (torch.randn(b, h, w, 8),), sizes)


# -- MaxViT: window and grid partitions, relative position bias ------------------------------


def _relative_index(p):
    coords = torch.stack(torch.meshgrid([torch.arange(p), torch.arange(p)], indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += p - 1
    rel[:, :, 1] += p - 1
    rel[:, :, 0] *= 2 * p - 1
    return rel.sum(-1)


class MaxVitBlock(torch.nn.Module):
    def __init__(self, C=8, heads=2, p=3):
        super().__init__()
        self.C, self.heads, self.p = C, heads, p
        self.table = torch.nn.Parameter(torch.randn((2 * p - 1) ** 2, heads))
        self.register_buffer("index", _relative_index(p))
        self.qkv = torch.nn.Linear(C, 3 * C)

    def partition(self, x):  # B, C, H, W -> B, windows, p*p, C
        B, C, H, W = x.shape
        p = self.p
        return x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p, C)

    def departition(self, x, hp, wp):
        B, G, PP, C = x.shape
        p = self.p
        return x.reshape(B, hp, wp, p, p, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, hp * p, wp * p)

    def grid(self, x):  # B, C, H, W -> B, (H/p)(W/p) groups, p*p strided by (H/p, W/p), C
        B, C, H, W = x.shape
        p = self.p
        return x.reshape(B, C, p, H // p, p, W // p).permute(0, 3, 5, 2, 4, 1).reshape(B, (H // p) * (W // p), p * p, C)

    def degrid(self, x, hp, wp):
        B, G, PP, C = x.shape
        p = self.p
        return x.reshape(B, hp, wp, p, p, C).permute(0, 5, 3, 1, 4, 2).reshape(B, C, p * hp, p * wp)

    def attention(self, x):  # B, G, P, C
        B, G, P, C = x.shape
        heads = self.heads
        q, k, v = self.qkv(x).reshape(B, G, P, 3, heads, C // heads).permute(3, 0, 1, 4, 2, 5).unbind(0)
        bias = self.table[self.index.view(-1)].view(P, P, -1).permute(2, 0, 1).contiguous()
        a = torch.einsum("bghic,bghjc->bghij", q, k) * (C // heads) ** -0.5 + bias
        return torch.einsum("bghij,bghjc->bghic", a.softmax(-1), v).permute(0, 1, 3, 2, 4).reshape(B, G, P, C)

    def forward(self, x):
        B, C, H, W = x.shape
        y = self.departition(self.attention(self.partition(x)), H // self.p, W // self.p) + x
        return self.degrid(self.attention(self.grid(y)), H // self.p, W // self.p) + y


def test_maxvit_window_and_grid_partitions_over_changing_sizes():
    sizes = [(2, 6, 9), (3, 9, 6), (2, 12, 15)]
    _compile_loop(MaxVitBlock().eval(), lambda b, h, w: (torch.randn(b, 8, h, w),), sizes)


# -- Twins-SVT: locally grouped (padded) and global sub-sampled attention, conv position encoding


class TwinsBlock(torch.nn.Module):
    def __init__(self, C=8, heads=2, ws=3, sr=2, local=True):
        super().__init__()
        self.C, self.heads, self.ws, self.sr, self.local = C, heads, ws, sr, local
        self.qkv = torch.nn.Linear(C, 3 * C)
        self.q, self.kv = torch.nn.Linear(C, C), torch.nn.Linear(C, 2 * C)
        self.reduce = torch.nn.Conv2d(C, C, sr, stride=sr)
        self.norm = torch.nn.LayerNorm(C)
        self.pos = torch.nn.Conv2d(C, C, 3, padding=1, groups=C)

    def locally_grouped(self, x, H, W):
        B, N, C = x.shape
        ws, heads = self.ws, self.heads
        x = x.view(B, H, W, C)
        pad_r, pad_b = (ws - W % ws) % ws, (ws - H % ws) % ws
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        _, Hp, Wp, _ = x.shape
        gh, gw = Hp // ws, Wp // ws
        x = x.reshape(B, gh, ws, gw, ws, C).transpose(2, 3)
        q, k, v = self.qkv(x).reshape(B, gh * gw, ws * ws, 3, heads, C // heads).permute(3, 0, 1, 4, 2, 5).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(B, gh, gw, ws, ws, C)
        x = x.transpose(2, 3).reshape(B, gh * ws, gw * ws, C)[:, :H, :W, :].contiguous()
        return x.reshape(B, N, C)

    def global_subsampled(self, x, H, W):
        B, N, C = x.shape
        heads = self.heads
        q = self.q(x).reshape(B, N, heads, C // heads).permute(0, 2, 1, 3)
        kv = self.reduce(x.permute(0, 2, 1).reshape(B, C, H, W)).reshape(B, C, -1).permute(0, 2, 1)
        kv = self.kv(self.norm(kv)).reshape(B, -1, 2, heads, C // heads).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, kv[0], kv[1]).transpose(1, 2).reshape(B, N, C)

    def forward(self, img):
        B, C, H, W = img.shape
        x = img.flatten(2).transpose(1, 2)
        if self.local:
            return x + self.locally_grouped(x, H, W)
        x = self.pos(x.transpose(1, 2).view(B, C, H, W)).flatten(2).transpose(1, 2) + x
        return x + self.global_subsampled(x, H, W)


def test_twins_locally_grouped_attention_over_changing_sizes():
    # windows padded to a multiple of 3: torch's view meta gives the window's size as
    # Hp // (Hp // 3), whose interval bounds reach 0, and attention's second product (5-D
    # q, k, v: bmm) has it as its inner dim; that product runs in ONNX Runtime all the same
    sizes = [(2, 7, 10), (3, 10, 8), (2, 5, 5)]
    _compile_loop(TwinsBlock(local=True).eval(), lambda b, h, w: (torch.randn(b, 8, h, w),), sizes)


def test_twins_subsampled_attention_and_position_conv_over_changing_sizes():
    sizes = [(2, 7, 10), (3, 10, 8), (2, 6, 6)]
    _compile_loop(TwinsBlock(local=False).eval(), lambda b, h, w: (torch.randn(b, 8, h, w),), sizes)


# -- RAFT: correlation pyramid, convex upsampling ----------------------------------------------


class RaftStep(torch.nn.Module):
    def __init__(self, levels=3, factor=4):
        super().__init__()
        self.levels, self.factor = levels, factor

    def forward(self, f1, f2, flow, mask):
        B, C, H, W = f1.shape
        corr = torch.matmul(f1.view(B, C, H * W).transpose(1, 2), f2.view(B, C, H * W)) / math.sqrt(C)
        corr = corr.view(B * H * W, 1, H, W)
        feats = [corr.flatten(1).mean(1)]
        for _ in range(self.levels - 1):
            corr = F.avg_pool2d(corr, kernel_size=2, stride=2)
            feats.append(corr.flatten(1).mean(1))
        coords = torch.stack(torch.meshgrid(torch.arange(H, dtype=f1.dtype), torch.arange(W, dtype=f1.dtype), indexing="ij"), 0)
        coords = coords[None].repeat(B, 1, 1, 1) + flow
        k = self.factor
        mask = mask.view(B, 1, 9, k, k, H, W).softmax(2)
        up = F.unfold(k * coords, kernel_size=3, padding=1).view(B, 2, 9, 1, 1, H, W)
        up = (mask * up).sum(2).permute(0, 1, 4, 2, 5, 3).reshape(B, 2, k * H, k * W)
        return up, *feats


def test_raft_correlation_and_upsampling_over_changing_sizes():
    def make(b, h, w):
        return torch.randn(b, 8, h, w), torch.randn(b, 8, h, w), torch.randn(b, 2, h, w), torch.randn(b, 9 * 16, h, w)

    sizes = [(2, 12, 16), (3, 16, 12), (2, 20, 24)]
    _compile_loop(RaftStep().eval(), make, sizes, atol=1e-4)


# -- Faster R-CNN: box decoding, clipping to a symbolic image size, top-k, filtering ---------


class DecodeAndFilter(torch.nn.Module):
    def __init__(self, top=8, min_size=1.0, score_thresh=0.05):
        super().__init__()
        self.top, self.min_size, self.score_thresh = top, min_size, score_thresh
        self.clip = math.log(1000.0 / 16)

    def forward(self, deltas, anchors, logits, image):
        H, W = image.shape[-2:]
        widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
        cx, cy = anchors[:, 0] + 0.5 * widths, anchors[:, 1] + 0.5 * heights
        dx, dy = deltas[:, 0::4], deltas[:, 1::4]
        dw, dh = torch.clamp(deltas[:, 2::4], max=self.clip), torch.clamp(deltas[:, 3::4], max=self.clip)
        pcx, pcy = dx * widths[:, None] + cx[:, None], dy * heights[:, None] + cy[:, None]
        pw, ph = torch.exp(dw) * widths[:, None], torch.exp(dh) * heights[:, None]
        c = torch.tensor(0.5, dtype=pcx.dtype) * pw
        boxes = torch.stack((pcx - c, pcy - 0.5 * ph, pcx + c, pcy + 0.5 * ph), dim=2).flatten(1).reshape(-1, 4)
        x = boxes[..., 0::2].clamp(min=0, max=W)
        y = boxes[..., 1::2].clamp(min=0, max=H)
        boxes = torch.stack((x, y), dim=-1).reshape(boxes.shape)
        scores = torch.sigmoid(logits).flatten()
        top = scores.topk(min(self.top, scores.shape[0])).indices
        boxes, scores = boxes[top], scores[top]
        ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        return boxes, scores, (ws >= self.min_size) & (hs >= self.min_size) & (scores >= self.score_thresh)


def test_detection_box_decoding_and_filtering_over_changing_sizes():
    def make(n, h, w):
        xy = torch.rand(n, 2) * torch.tensor([w, h])
        anchors = torch.cat([xy, xy + 4 + torch.rand(n, 2) * 20], 1)
        return torch.randn(n, 4), anchors, torch.randn(n), torch.zeros(3, h, w)

    sizes = [(20, 30, 40), (33, 41, 37), (50, 64, 20)]
    _compile_loop(DecodeAndFilter().eval(), make, sizes)


# -- Window partition round trips: the compile time that triples per block -------------


def _window_round_trips(k, p=7):
    def f(x):
        for _ in range(k):
            B, C, H, W = x.shape
            w = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p, C)
            x = (w * 2).reshape(B, H // p, W // p, p, p, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, (H // p) * p, (W // p) * p)
        return x

    return f


def test_nested_window_sizes_warn_once_and_backed_size_oblivious_keeps_them_small(ortlite_log):
    """torch's fake view derives a window partition's sizes by floor divisions of the input's
    (W // (W // 7) for 7), and each round trip triples the width's expression tree: ortlite
    says so once, with the torch option that keeps the sizes as asked (docs/dynamic-shapes.md)."""
    import torch.fx.experimental._config as fx_config

    warned = lambda: [r for r in ortlite_log.records if "backed_size_oblivious" in r.getMessage()]
    x = torch.rand(2, 4, 56, 42)
    torch._dynamo.reset()
    f = _window_round_trips(2)  # a tree of 63 nodes: no warning
    assert_same(torch.compile(f, backend=ortlite.Backend(), dynamic=True)(x), f(x))
    assert not warned()
    torch._dynamo.reset()
    f = _window_round_trips(3)  # 195 nodes over 16 distinct sub-expressions
    assert_same(torch.compile(f, backend=ortlite.Backend(), dynamic=True)(x), f(x))
    assert len(warned()) == 1

    ortlite_log.clear()
    torch._dynamo.reset()
    f = _window_round_trips(8)  # tens of minutes without the option
    backend = ortlite.Backend()
    compiled = torch.compile(f, backend=backend, dynamic=True)
    ortlite.logs._warned.clear()
    with fx_config.patch(backed_size_oblivious=True):
        for shape in ((2, 4, 56, 42), (3, 4, 70, 63)):
            x = torch.rand(shape)
            assert_same(compiled(x), f(x))
    assert backend.stats.graphs == 1 and not warned()


def test_correlation_lookup_lowers_under_backed_size_oblivious():
    """RAFT's correlation lookup: grid_sample on a volume whose sizes are products of pooled
    sizes. Under backed_size_oblivious input sizes range from 0, and asking numel() == 0
    needed a guard, which left every grid_sample to torch; may_be_empty asks without one."""
    import torch.fx.experimental._config as fx_config

    def lookup(fmap, coords):
        B, C, H, W = fmap.shape
        f = F.avg_pool2d(fmap, 2)
        h, w = f.shape[-2:]
        corr = (f.flatten(2).transpose(1, 2) @ f.flatten(2)).reshape(B * h * w, 1, h, w)
        grid = coords[:, :h, :w].reshape(B * h * w, 1, 1, 2)
        return F.grid_sample(corr, grid, align_corners=True).reshape(B, h, w)

    backend = ortlite.Backend()
    compiled = torch.compile(lookup, backend=backend, dynamic=True)
    with fx_config.patch(backed_size_oblivious=True), torch.no_grad():
        for B, H, W in ((2, 12, 16), (3, 10, 14)):
            fmap, coords = torch.randn(B, 4, H, W), torch.rand(B, H, W, 2) * 2.2 - 1.1
            assert_same(compiled(fmap, coords), lookup(fmap, coords), atol=1e-5, rtol=1e-4)
    assert backend.stats.fallback_ops == {}, backend.stats.fallback_ops
