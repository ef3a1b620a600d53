"""A model zoo for changing shapes: transformers architectures built from small configs
(random weights, no downloads), each called with inputs whose sizes change between calls,
compiled with ortlite under Dynamo's automatic dynamic (the second call recompiles with
symbolic sizes) and under dynamic=True. Every call is compared with eager; what runs in
torch is counted and its reasons collected; then eager, ortlite static and ortlite dynamic
are timed at one fixed shape (one thread, interleaved rounds, medians).

    python bench/zoo.py                      # the whole zoo, timed; writes bench/results/zoo.md
    python bench/zoo.py --models 'bert|t5'   # a regex over the zoo's names
    python bench/zoo.py --quick              # a few fast models, no timing (CI)
    python bench/zoo.py --no-time

From a test: `run_model(name, dynamic)` (dynamic None: automatic, True: dynamic=True) gives
a dict with "matches", "calls", "graphs", "sessions", "fallback_ops", "reasons", "error", ...
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import itertools
import logging
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
import types
from typing import Callable

import torch
import torch.utils._pytree as pytree

import ortlite
import ortlite.logs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import interleaved  # noqa: E402

RTOL = ATOL = 1e-4
EXTRA_OPTIONS: dict = {}  # given to every ortlite candidate (--no-size-constants)
VOCAB = 100
QUICK = ["bert", "gpt2", "llama", "t5", "vit", "resnet", "mixtral"]


# --- inputs --------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mask(b: int, s: int) -> torch.Tensor:
    """Right padding: row 0 a quarter padded, row 1 none, row 2 one token, row 3 three."""
    mask = torch.ones(b, s, dtype=torch.long)
    for i in range(b):
        pad = [s // 4, 0, 1, 3][i % 4]
        if pad:
            mask[i, s - pad :] = 0
    return mask


def text_inputs(shape, seed, *, mask=True):
    b, s = shape
    ids = torch.randint(0, VOCAB, (b, s), generator=_gen(seed))
    kwargs = {"input_ids": ids}
    if mask:
        kwargs["attention_mask"] = _mask(b, s)
    return kwargs


def seq2seq_inputs(shape, seed):
    b, s, t = shape
    g = _gen(seed)
    return {
        "input_ids": torch.randint(3, VOCAB, (b, s), generator=g),
        "attention_mask": _mask(b, s),
        "decoder_input_ids": torch.randint(3, VOCAB, (b, t), generator=g),
    }


def image_inputs(shape, seed):
    b, px = shape
    return {"pixel_values": torch.randn(b, 3, px, px, generator=_gen(seed))}


def audio_inputs(shape, seed):
    b, n = shape
    return {"input_values": torch.randn(b, n, generator=_gen(seed))}


def whisper_inputs(mel_bins, frames):
    def make(shape, seed):
        b, t = shape
        g = _gen(seed)
        return {
            "input_features": torch.randn(b, mel_bins, frames, generator=g),
            "decoder_input_ids": torch.randint(3, VOCAB, (b, t), generator=g),
        }

    return make


TEXT_SHAPES = [(2, 16), (3, 24), (4, 11)]  # (batch, sequence); no size 1: Dynamo specializes it
SEQ2SEQ_SHAPES = [(2, 16, 5), (3, 24, 8), (4, 11, 7)]  # (batch, source, target)
IMAGE_SHAPES = [(2, 64), (3, 96), (4, 80)]  # (batch, pixels); at 32 px a CNN's last maps are 1x1: a size-1 guard
FIXED_IMAGE_SHAPES = [(2, 32), (3, 32), (4, 32)]  # models whose position embeddings fix the size
AUDIO_SHAPES = [(2, 800), (3, 1200), (4, 1000)]  # (batch, samples)
WHISPER_SHAPES = [(2, 5), (3, 8), (4, 7)]  # (batch, decoder length); the encoder's length is fixed


# --- the zoo -------------------------------------------------------------------------


@dataclasses.dataclass
class Spec:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable  # (shape, seed) -> kwargs
    shapes: list
    extra: dict = dataclasses.field(default_factory=dict)  # constant kwargs for every call
    family: str = ""
    options: dict = dataclasses.field(default_factory=dict)  # ortlite.Options for this model


ZOO: dict[str, Spec] = {}

H = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB)
NO_DROP = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _t():
    import transformers

    return transformers


def spec(name, family, inputs, shapes, extra=None):
    def register(build):
        ZOO[name] = Spec(name, build, inputs, shapes, extra or {}, family)
        return build

    return register


def text(name, family="encoder", **extra):
    return spec(name, family, text_inputs, TEXT_SHAPES, extra)


def causal(name):
    return spec(name, "decoder", text_inputs, TEXT_SHAPES, {"use_cache": False})


# encoders


@text("bert")
def _bert():
    t = _t()
    return t.BertModel(t.BertConfig(**H, **NO_DROP, max_position_embeddings=128))


@text("roberta")
def _roberta():
    t = _t()
    return t.RobertaModel(t.RobertaConfig(**H, **NO_DROP, max_position_embeddings=130, pad_token_id=1))


@text("distilbert")
def _distilbert():
    t = _t()
    return t.DistilBertModel(t.DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128))


@text("albert")
def _albert():
    t = _t()
    return t.AlbertModel(t.AlbertConfig(**H, **NO_DROP, embedding_size=32, max_position_embeddings=128))


@text("electra")
def _electra():
    t = _t()
    return t.ElectraModel(t.ElectraConfig(**H, **NO_DROP, embedding_size=32, max_position_embeddings=128))


@text("deberta_v2")
def _deberta_v2():
    t = _t()
    return t.DebertaV2Model(
        t.DebertaV2Config(
            **H, **NO_DROP, max_position_embeddings=128, relative_attention=True, position_buckets=32,
            pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
            type_vocab_size=0,
        )
    )


@text("mpnet")
def _mpnet():
    t = _t()
    return t.MPNetModel(t.MPNetConfig(**H, **NO_DROP, max_position_embeddings=130))


# decoders


@causal("gpt2")
def _gpt2():
    t = _t()
    return t.GPT2LMHeadModel(t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=128, bos_token_id=0, eos_token_id=0))


@causal("gpt_neo")
def _gpt_neo():
    t = _t()  # local attention with a window (8) shorter than the sequences
    return t.GPTNeoForCausalLM(
        t.GPTNeoConfig(
            hidden_size=64, num_layers=2, num_heads=4, vocab_size=VOCAB, max_position_embeddings=128,
            attention_types=[[["global", "local"], 1]], window_size=8, intermediate_size=128, bos_token_id=0, eos_token_id=0,
        )
    )


@causal("llama")
def _llama():
    t = _t()
    return t.LlamaForCausalLM(t.LlamaConfig(**H, num_key_value_heads=2, max_position_embeddings=128))


@causal("mistral")
def _mistral():
    t = _t()  # sliding window (8) shorter than the sequences
    return t.MistralForCausalLM(t.MistralConfig(**H, num_key_value_heads=2, max_position_embeddings=128, sliding_window=8))


@causal("qwen2")
def _qwen2():
    t = _t()
    return t.Qwen2ForCausalLM(t.Qwen2Config(**H, num_key_value_heads=2, max_position_embeddings=128))


@causal("qwen3")
def _qwen3():
    t = _t()
    return t.Qwen3ForCausalLM(t.Qwen3Config(**H, num_key_value_heads=2, head_dim=16, max_position_embeddings=128))


@causal("phi")
def _phi():
    t = _t()
    return t.PhiForCausalLM(t.PhiConfig(**H, max_position_embeddings=128))


@causal("phi3")
def _phi3():
    t = _t()
    return t.Phi3ForCausalLM(t.Phi3Config(**H, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2))


@causal("gemma")
def _gemma():
    t = _t()
    return t.GemmaForCausalLM(t.GemmaConfig(**H, num_key_value_heads=1, head_dim=16, max_position_embeddings=128))


@causal("gemma2")
def _gemma2():
    t = _t()  # soft-capping, alternating sliding (8) and global layers
    return t.Gemma2ForCausalLM(t.Gemma2Config(**H, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, sliding_window=8))


@causal("opt")
def _opt():
    t = _t()
    return t.OPTForCausalLM(
        t.OPTConfig(hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=128, word_embed_proj_dim=64)
    )


@causal("bloom")
def _bloom():
    t = _t()  # ALiBi
    return t.BloomForCausalLM(t.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB))


@causal("falcon")
def _falcon():
    t = _t()
    return t.FalconForCausalLM(t.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=128))


@causal("gpt_neox")
def _gpt_neox():
    t = _t()
    return t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**H, max_position_embeddings=128))


@causal("mixtral")
def _mixtral():
    t = _t()
    return t.MixtralForCausalLM(t.MixtralConfig(**H, num_key_value_heads=2, max_position_embeddings=128, num_local_experts=4, num_experts_per_tok=2))


@causal("qwen2_moe")
def _qwen2_moe():
    t = _t()
    return t.Qwen2MoeForCausalLM(
        t.Qwen2MoeConfig(
            **H, num_key_value_heads=2, max_position_embeddings=128, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=64,
        )
    )


# (mixtral and qwen2_moe sort expert ids, all ties, and put the rows back: with no options,
# their sorts run unchecked in ONNX Runtime, lower/tie_order.py)


# encoder-decoders

S2S = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
           encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB, max_position_embeddings=128)


@spec("t5", "seq2seq", seq2seq_inputs, SEQ2SEQ_SHAPES, {"use_cache": False})
def _t5():
    t = _t()
    return t.T5Model(t.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0))


@spec("bart", "seq2seq", seq2seq_inputs, SEQ2SEQ_SHAPES, {"use_cache": False})
def _bart():
    t = _t()
    return t.BartModel(t.BartConfig(**S2S))


@spec("marian", "seq2seq", seq2seq_inputs, SEQ2SEQ_SHAPES, {"use_cache": False})
def _marian():
    t = _t()  # sinusoidal positions
    return t.MarianMTModel(t.MarianConfig(**S2S, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, decoder_vocab_size=VOCAB))


@spec("pegasus", "seq2seq", seq2seq_inputs, SEQ2SEQ_SHAPES, {"use_cache": False})
def _pegasus():
    t = _t()
    return t.PegasusModel(t.PegasusConfig(**S2S))


# speech

W2V = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32),
           conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
           mask_time_prob=0.0, vocab_size=VOCAB)


@spec("wav2vec2", "speech", audio_inputs, AUDIO_SHAPES)
def _wav2vec2():
    t = _t()
    return t.Wav2Vec2Model(t.Wav2Vec2Config(**W2V))


@spec("hubert", "speech", audio_inputs, AUDIO_SHAPES)
def _hubert():
    t = _t()
    return t.HubertModel(t.HubertConfig(**W2V))


@spec("whisper", "speech", whisper_inputs(16, 64), WHISPER_SHAPES, {"use_cache": False})
def _whisper():
    t = _t()
    return t.WhisperModel(
        t.WhisperConfig(
            vocab_size=VOCAB, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
            max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        )
    )


# vision transformers

VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8)


@spec("vit", "vit", image_inputs, FIXED_IMAGE_SHAPES)
def _vit():
    t = _t()
    return t.ViTModel(t.ViTConfig(**VIT))


@spec("vit_interp", "vit", image_inputs, IMAGE_SHAPES, {"interpolate_pos_encoding": True})
def _vit_interp():
    t = _t()  # the position embeddings interpolated (bicubic) to each image size
    return t.ViTModel(t.ViTConfig(**VIT))


@spec("deit", "vit", image_inputs, FIXED_IMAGE_SHAPES)
def _deit():
    t = _t()
    return t.DeiTModel(t.DeiTConfig(**VIT))


@spec("beit", "vit", image_inputs, FIXED_IMAGE_SHAPES)
def _beit():
    t = _t()
    return t.BeitModel(t.BeitConfig(**VIT, use_relative_position_bias=True))


@spec("dinov2", "vit", image_inputs, IMAGE_SHAPES)
def _dinov2():
    t = _t()  # always interpolates its position embeddings
    return t.Dinov2Model(t.Dinov2Config(**VIT))


@spec("swin", "vit", image_inputs, IMAGE_SHAPES)
def _swin():
    t = _t()  # windows of 4 patches; sizes not a multiple of the window are padded
    return t.SwinModel(t.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4))


# CNNs


@spec("resnet", "cnn", image_inputs, IMAGE_SHAPES)
def _resnet():
    t = _t()
    return t.ResNetModel(t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic"))


@spec("convnext", "cnn", image_inputs, IMAGE_SHAPES)
def _convnext():
    t = _t()
    return t.ConvNextModel(t.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]))


@spec("mobilenet_v2", "cnn", image_inputs, IMAGE_SHAPES)
def _mobilenet_v2():
    t = _t()
    return t.MobileNetV2Model(t.MobileNetV2Config(depth_multiplier=0.25, image_size=32))


@spec("segformer", "cnn", image_inputs, IMAGE_SHAPES)
def _segformer():
    t = _t()
    return t.SegformerModel(
        t.SegformerConfig(hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4], decoder_hidden_size=64)
    )


@spec("regnet", "cnn", image_inputs, IMAGE_SHAPES)
def _regnet():
    t = _t()
    return t.RegNetModel(t.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], groups_width=8))


@spec("efficientnet", "cnn", image_inputs, IMAGE_SHAPES)
def _efficientnet():
    t = _t()
    return t.EfficientNetModel(t.EfficientNetConfig(image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320))


# --- running -------------------------------------------------------------------------


class _Capture(logging.Handler):
    """The ortlite logger's messages (fallback warnings name the op and the reason)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _call(model, kwargs, extra):
    return model(**kwargs, **extra, return_dict=False)


def _leaves(out):
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


def compare(got, expected) -> str | None:
    """None when every tensor leaf matches eager (rtol = atol = 1e-4), else what differs."""
    g, e = _leaves(got), _leaves(expected)
    if len(g) != len(e):
        return f"{len(g)} tensor outputs, eager has {len(e)}"
    for k, (a, b) in enumerate(zip(g, e)):
        try:
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
        except AssertionError as err:
            if a.shape == b.shape and a.dtype == b.dtype and a.is_floating_point():
                diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
                return f"output {k} {tuple(b.shape)}: max abs error {diff:.3g}"
            return f"output {k}: {str(err).splitlines()[0]}"
    return None


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return ZOO[name].build().eval()


def _dynamo_counts():
    c = torch._dynamo.utils.counters
    return c["stats"]["unique_graphs"], c["frames"]["ok"], sum(c["graph_break"].values())


def _guard_failures() -> list[str]:
    """Dynamo's recompile reasons so far (the guards that failed), all code objects."""
    return [str(r) for reasons in torch._dynamo.utils.guard_failures.values() for r in reasons]


def run_model(name: str, dynamic: bool | None = None, model: torch.nn.Module | None = None) -> dict:
    """Compile the zoo model `name` with a fresh ortlite.Backend (dynamic None: Dynamo's
    automatic dynamic; True: dynamic=True), call it on each of its shapes and compare with
    eager. Returns: calls, matches, per_call (None or what differed / the exception),
    graphs (Dynamo graphs), graphs_per_call, frames_per_call, graph_breaks, ort_graphs,
    sessions, runs, fallback_ops, fallback_ops_first_call, reasons (ortlite's log lines),
    reasons_per_call, recompile_reasons (Dynamo's failed guards, per call), error (the first exception's traceback, or None), seconds.
    keep: leave Dynamo's caches as they are and return the compiled model as "compiled"."""
    spec = ZOO[name]
    start = time.perf_counter()
    result = {"name": name, "dynamic": dynamic, "calls": len(spec.shapes), "matches": 0, "per_call": [], "error": None,
              "graphs": 0, "graphs_per_call": [], "frames_per_call": [], "graph_breaks": {}, "ort_graphs": 0, "sessions": 0,
              "runs": 0, "fallback_ops": {}, "fallback_ops_first_call": {}, "reasons": [], "reasons_per_call": [], "recompile_reasons": []}
    try:
        model = model if model is not None else build(name)
    except Exception:
        result["error"] = "build: " + traceback.format_exc()
        result["seconds"] = time.perf_counter() - start
        return result
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    capture = _Capture()
    logger = logging.getLogger("ortlite")
    logger.addHandler(capture)
    backend = ortlite.Backend(ortlite.Options(**spec.options, **EXTRA_OPTIONS))
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    try:
        for k, shape in enumerate(spec.shapes):
            kwargs = spec.inputs(shape, seed=1000 * k + 7)
            before = _dynamo_counts()
            failed_before = len(_guard_failures())
            ortlite.logs._warned.clear()  # once-per-cause warnings: each call reports its own
            seen = len(capture.messages)
            with torch.no_grad():
                expected = _call(model, kwargs, spec.extra)
                try:
                    got = _call(compiled, kwargs, spec.extra)
                    diff = compare(got, expected)
                except Exception as e:
                    diff = f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    if result["error"] is None:
                        result["error"] = f"call {k + 1} {shape}: " + traceback.format_exc()
            after = _dynamo_counts()
            result["graphs_per_call"].append(after[0] - before[0])
            result["frames_per_call"].append(after[1] - before[1])
            result["reasons_per_call"].append(capture.messages[seen:])
            result["recompile_reasons"].append(_guard_failures()[failed_before:])
            result["per_call"].append(diff)
            result["matches"] += diff is None
            if k == 0:
                result["fallback_ops_first_call"] = dict(backend.stats.fallback_ops)
        stats = backend.stats
        result.update(graphs=_dynamo_counts()[0], ort_graphs=stats.graphs, sessions=stats.sessions, runs=stats.runs,
                      fallback_ops=dict(stats.fallback_ops))
        result["graph_breaks"] = dict(torch._dynamo.utils.counters["graph_break"])
        result["reasons"] = list(dict.fromkeys(capture.messages))
    finally:
        logger.removeHandler(capture)
        torch._dynamo.reset()
    result["seconds"] = time.perf_counter() - start
    return result


_own_code_ids = itertools.count()


def own_code(model, extra):
    """model called from a function with a code object and name of its own, so Dynamo's
    cache entries and automatic-dynamic state of one candidate do not touch another's."""

    def call(kwargs):
        return model(**kwargs, **extra, return_dict=False)

    name = f"zoo_call_{next(_own_code_ids)}"
    code = call.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, call.__globals__, name, None, call.__closure__)


class AllTensorOutputs(torch.nn.Module):
    """The zoo model called with its extra arguments, returning every tensor leaf of its
    output as a tuple: what ortlite.compile (torch.export) takes, doing the same work as the
    torch.compile candidates."""

    def __init__(self, model, extra):
        super().__init__()
        self.model = model
        self.extra = extra

    def forward(self, **kwargs):
        return tuple(_leaves(self.model(**kwargs, **self.extra, return_dict=False)))


def time_model(name: str, rounds: int = 7, min_block_s: float = 0.02, model=None, clock=time.perf_counter) -> dict:
    """Median ms per call at the zoo model's first shape: eager, ortlite static (dynamic=False),
    ortlite dynamic (dynamic=True, warmed up at another shape first), ortlite auto (Dynamo's
    default: called at another shape first, so the first shape recompiles with symbolic
    sizes, and that graph is timed) and ortlite AOT (ortlite.compile at the first shape, the
    floor the torch.compile path is held to); interleaved rounds.
    The order of compiling biases the times: on these machines a graph compiled later ran up
    to 10% faster than the same graph compiled earlier in the process (its sessions and
    weights in memory allocated later). So each ortlite candidate is compiled twice, in
    opposite orders (aot, dynamic, static, auto, then auto, static, dynamic, aot), both copies timed in
    the same rounds, and its time is the mean of the two copies' medians. Every copy is
    called through the same kind of function (own_code), with a code object of its own (a
    module compiled whole, torch.compile(model), pays nn.Module's call path on top: the
    dynamic copy reused from run_model that way measured up to 35% slower).
    clock: time.thread_time counts this thread's CPU time only (ONNX Runtime runs on the
    calling thread at one thread), steadier than wall time on a machine shared with other jobs."""
    spec = ZOO[name]
    model = model if model is not None else build(name)
    kwargs = spec.inputs(spec.shapes[0], seed=7)
    other = spec.inputs(spec.shapes[1], seed=1007)
    eager = lambda kw: model(**kw, **spec.extra, return_dict=False)  # noqa: E731
    torch._dynamo.reset()

    def compiled(kind):
        options = ortlite.Options(**spec.options, **EXTRA_OPTIONS)
        if kind == "aot":
            return ortlite.compile(AllTensorOutputs(model, spec.extra), kwargs=kwargs, options=options)
        mode = {"static": False, "dynamic": True, "auto": None}[kind]
        return torch.compile(own_code(model, spec.extra), backend=ortlite.Backend(options), dynamic=mode)

    candidates = {"eager": lambda: eager(kwargs)}
    with torch.no_grad():
        for copy, order in enumerate((["aot", "dynamic", "static", "auto"], ["auto", "static", "dynamic", "aot"])):
            for kind in order:
                fn = compiled(kind)
                if kind in ("dynamic", "auto"):
                    fn(other)  # auto: static at the other shape; the first shape then recompiles symbolic
                call = functools.partial(fn, **kwargs) if kind == "aot" else functools.partial(fn, kwargs)
                call()
                candidates[(kind, copy)] = call
        for call in candidates.values():
            call()
        # iterations per block: about min_block_s of eager
        t0 = time.perf_counter()
        eager(kwargs)
        iters = max(1, min(50, int(min_block_s / max(time.perf_counter() - t0, 1e-6))))

        def block(call):
            t0 = clock()
            for _ in range(iters):
                call()
            return (clock() - t0) / iters * 1e3

        samples = interleaved(candidates, rounds, block)
    torch._dynamo.reset()
    ms = {k: statistics.median(v) for k, v in samples.items()}
    mean = {kind: (ms[(kind, 0)] + ms[(kind, 1)]) / 2 for kind in ("static", "dynamic", "auto", "aot")}
    return {"eager_ms": ms["eager"], "static_ms": mean["static"], "dynamic_ms": mean["dynamic"], "auto_ms": mean["auto"],
            "aot_ms": mean["aot"], "iters": iters,
            "rounds": rounds, "shape": spec.shapes[0], "copies_ms": {f"{k[0]}_{k[1]}": v for k, v in ms.items() if k != "eager"}}


# --- reporting -----------------------------------------------------------------------

_REASON = re.compile(r"^ortlite: (.+?) runs in torch \((.*)\)$", re.S)
_TARGET = re.compile(r"^<(?:built-in )?function (\w+)(?: at 0x[0-9a-f]+)?>$")


def parse_reason(message: str) -> tuple[str, str]:
    """(op, reason) of a fallback warning, the op named as in Backend.stats.fallback_ops
    ('aten.view.default', or 'mul' for <built-in function mul>); for other messages
    ('graph with [...] runs in torch: ...') the op list and the rest."""
    m = _REASON.match(message)
    if m:
        op = m.group(1)
        target = _TARGET.match(op)
        return (target.group(1) if target else op), m.group(2)
    m = re.match(r"^ortlite: graph with (\[.*?\]) runs in torch: (.*)$", message, re.S)
    if m:
        return f"graph {m.group(1)}", m.group(2)
    return "(other)", message


def _ops(ops: dict) -> str:
    return ", ".join(f"{k.removeprefix('aten.')}: {v}" for k, v in sorted(ops.items())) or "-"


def _short_reasons(messages) -> str:
    return "; ".join(sorted({f"{op.removeprefix('aten.')} ({reason})" for op, reason in map(parse_reason, messages)})) or "-"


def _match(r) -> str:
    if r["error"] and r["error"].startswith("build"):
        return "build failed"
    text = f"{r['matches']}/{r['calls']}"
    if any(r["per_call"]):
        text += " ✗"
    return text


def _sessions(r) -> str:
    return f"{r['sessions']} / {r['graphs']}"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def report(results: dict, timings: dict, header: str) -> str:
    lines = [header, ""]
    lines += [
        "auto = Dynamo's default (automatic dynamic: call 2 recompiles with symbolic sizes); dyn = `dynamic=True`.",
        "graphs/call = Dynamo graphs compiled at each call; sess/graphs = ONNX Runtime sessions over Dynamo graphs;",
        "fallback = aten op: nodes left to torch (ortlite's stats); static = at call 1 of auto (static sizes).",
        "Timing: ms per call at the first shape, 1 thread, medians of interleaved rounds; static = `dynamic=False`;",
        "AOT = ortlite.compile (torch.export, weights as initializers) at the same shape;",
        "auto = the default path's symbolic graph (compiled at another shape first, so the first shape recompiles).",
        "Each ortlite column: the mean of two copies compiled in opposite orders (a graph compiled later ran faster).",
        "",
        "| model | shapes | auto match | auto graphs/call | auto sess/graphs | dyn match | dyn graphs/call | dyn sess/graphs "
        "| fallback static | fallback auto (all calls) | fallback dyn | reasons (dyn) | eager ms | static ms | dynamic ms "
        "| dyn/static | dyn/eager | auto ms | auto/static | auto/eager | AOT ms | static/AOT |",
        "|" + "---|" * 22,
    ]
    for name, (auto, dyn) in results.items():
        t = timings.get(name)
        tcols = ["-"] * 10
        if t and "error" not in t:
            tcols = [f"{t['eager_ms']:.2f}", f"{t['static_ms']:.2f}", f"{t['dynamic_ms']:.2f}",
                     f"{t['dynamic_ms'] / t['static_ms']:.2f}", f"{t['dynamic_ms'] / t['eager_ms']:.2f}",
                     f"{t['auto_ms']:.2f}", f"{t['auto_ms'] / t['static_ms']:.2f}", f"{t['auto_ms'] / t['eager_ms']:.2f}",
                     f"{t['aot_ms']:.2f}", f"{t['static_ms'] / t['aot_ms']:.2f}"]
        elif t:
            tcols = ["timing failed"] + ["-"] * 9
        shapes = " ".join("x".join(map(str, s)) for s in ZOO[name].shapes)
        cols = [name, shapes, _match(auto), str(auto["graphs_per_call"]), _sessions(auto), _match(dyn), str(dyn["graphs_per_call"]),
                _sessions(dyn), _ops(auto["fallback_ops_first_call"]), _ops(auto["fallback_ops"]), _ops(dyn["fallback_ops"]),
                _short_reasons(dyn["reasons"]), *tcols]
        lines.append("| " + " | ".join(_cell(c) for c in cols) + " |")
    timed = [t for t in timings.values() if t and "error" not in t]
    if timed:
        lines.append("")
        for key, label in (("dynamic_ms", "dyn (`dynamic=True`)"), ("auto_ms", "auto (default, symbolic graph)")):
            ratios = sorted(t[key] / t["static_ms"] for t in timed)
            below = sum(t[key] < t["eager_ms"] for t in timed)
            lines.append(f"- {label} / static: median {statistics.median(ratios):.2f}, max {ratios[-1]:.2f}, "
                         f"at most 1.15 in {sum(r <= 1.15 for r in ratios)} of {len(ratios)}; below eager in {below} of {len(timed)}")
        ratios = sorted(t["static_ms"] / t["aot_ms"] for t in timed)
        lines.append(f"- static (torch.compile, frozen weights) / AOT (ortlite.compile): median {statistics.median(ratios):.2f}, "
                     f"max {ratios[-1]:.2f}, at most 1.15 in {sum(r <= 1.15 for r in ratios)} of {len(ratios)}")

    # what falls back, aggregated over models
    def subtract(total, first):
        return {op: n - first.get(op, 0) for op, n in total.items() if n - first.get(op, 0) > 0}

    sections = [
        ("with symbolic sizes (dynamic=True, all calls)", lambda a, d: (d["fallback_ops"], d["reasons"])),
        ("in auto's recompiled graphs (calls 2 and on: automatic dynamic)",
         lambda a, d: (subtract(a["fallback_ops"], a["fallback_ops_first_call"]), [m for ms in a["reasons_per_call"][1:] for m in ms])),
        ("at call 1 of auto (static sizes)",
         lambda a, d: (a["fallback_ops_first_call"], a["reasons_per_call"][0] if a["reasons_per_call"] else [])),
    ]
    for title, pick in sections:
        agg: dict[str, set] = collections.defaultdict(set)
        nodes: collections.Counter = collections.Counter()
        why: dict[str, set] = collections.defaultdict(set)
        for name, (auto, dyn) in results.items():
            ops, msgs = pick(auto, dyn)
            for op, n in ops.items():
                agg[op].add(name)
                nodes[op] += n
            for m in msgs:
                op, reason = parse_reason(m)
                why[op].add(reason)
                agg[op].add(name)
        lines += ["", f"## What falls back {title}", "",
                  "| op | models | nodes | models (names) | reasons (verbatim, distinct) |", "|---|---|---|---|---|"]
        for op in sorted(agg, key=lambda o: (-len(agg[o]), o)):
            cells = [op, str(len(agg[op])), str(nodes.get(op, "")), ", ".join(sorted(agg[op])), " / ".join(sorted(why.get(op, {"?"})))]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        if not agg:
            lines.append("| (nothing) | | | | |")

    lines += ["", "## ortlite's messages per model and call (verbatim)", ""]
    for name, (auto, dyn) in results.items():
        for r, mode in [(auto, "auto"), (dyn, "dynamic=True")]:
            for k, msgs in enumerate(r["reasons_per_call"]):
                for m in msgs:
                    lines.append(f"- {name} ({mode}) call {k + 1}: `{_cell(m)}`")

    lines += ["", "## Graph breaks (Dynamo)", ""]
    any_break = False
    for name, (auto, dyn) in results.items():
        breaks = {**auto["graph_breaks"], **dyn["graph_breaks"]}
        if breaks:
            any_break = True
            lines.append(f"- {name}: " + "; ".join(f"{_cell(k)[:300]} (x{v})" for k, v in breaks.items()))
    if not any_break:
        lines.append("none")

    lines += ["", "## Recompiles beyond the expected (auto: after call 2; dynamic=True: after call 1)", ""]
    any_recompile = False
    for name, (auto, dyn) in results.items():
        for r, mode, expected in [(auto, "auto", 2), (dyn, "dynamic=True", 1)]:
            for k, reasons in enumerate(r["recompile_reasons"]):
                if k >= expected and reasons:
                    any_recompile = True
                    lines.append(f"- {name} ({mode}) call {k + 1} {ZOO[name].shapes[k]}: " + "; ".join(_cell(x)[:400] for x in reasons))
    if not any_recompile:
        lines.append("none")

    lines += ["", "## Results that differ from eager, and errors", ""]
    bad = False
    for name, (auto, dyn) in results.items():
        for r, mode in [(auto, "auto"), (dyn, "dynamic=True")]:
            for k, d in enumerate(r["per_call"]):
                if d:
                    bad = True
                    lines.append(f"- {name} ({mode}) call {k + 1} {ZOO[name].shapes[k]}: {d}")
            if r["error"]:
                bad = True
                lines += [f"- {name} ({mode}) exception:", "", "```", r["error"].rstrip(), "```", ""]
        t = timings.get(name)
        if t and "error" in t:
            bad = True
            lines += [f"- {name} timing exception:", "", "```", t["error"].rstrip(), "```", ""]
    if not bad:
        lines.append("none")
    return "\n".join(lines) + "\n"


def _git_state() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True).stdout
        return head + (f" + uncommitted changes in {len(dirty.splitlines())} files" if dirty.strip() else "")
    except Exception:
        return "?"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="regex over the zoo's names (re.search)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}; no timing")
    parser.add_argument("--no-time", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-block-ms", type=float, default=20.0,
                        help="each timed block calls a candidate as often as eager runs in this long (at most 50 calls): "
                             "models of a few ms get 3-5 calls a block at the default, which leaves copies of one graph up to 40%% apart")
    parser.add_argument("--cpu-time", action="store_true", help="time with this thread's CPU time (time.thread_time), not wall time: steadier on a shared machine")
    parser.add_argument("--out", help="markdown file (default bench/results/zoo.md for a full run, none otherwise)")
    parser.add_argument("--json", help="also write every result (run_model's dicts, timings) to this file")
    parser.add_argument("--list", action="store_true", help="list the zoo and exit")
    parser.add_argument("--no-size-constants", action="store_true", help="ortlite with Options(size_constants=False)")
    args = parser.parse_args(argv)
    if args.no_size_constants:
        EXTRA_OPTIONS["size_constants"] = False
    if args.list:
        for name, s in ZOO.items():
            print(f"{name:14} {s.family:8} {s.shapes}")
        return 0
    torch.set_num_threads(1)
    logging.getLogger("ortlite").propagate = False  # captured per model, not printed
    logging.getLogger("ortlite").addHandler(logging.NullHandler())
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        print("bench/zoo.py needs transformers", file=sys.stderr)
        return 2
    names = QUICK if args.quick else list(ZOO)
    if args.models:
        names = [n for n in names if re.search(args.models, n)]
    timed = not (args.quick or args.no_time)
    out = args.out or (os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "zoo.md")
                       if not (args.quick or args.models) else None)

    start = time.perf_counter()
    state = _git_state()  # the code this process runs: ortlite is imported by now
    results, timings = {}, {}
    for name in names:
        t0 = time.perf_counter()
        try:
            model = build(name)
        except Exception:
            failed = run_model(name, None)  # records the build error
            results[name] = (failed, failed)
            print(f"{name}: build failed\n{failed['error']}", flush=True)
            continue
        auto = run_model(name, None, model)
        dyn = run_model(name, True, model)
        results[name] = (auto, dyn)
        if timed:
            try:
                clock = time.thread_time if args.cpu_time else time.perf_counter
                timings[name] = time_model(name, args.rounds, args.min_block_ms / 1e3, model=model, clock=clock)
            except Exception:
                timings[name] = {"error": traceback.format_exc()}
            torch._dynamo.reset()
        t = timings.get(name, {})
        tim = f" eager {t['eager_ms']:.2f} static {t['static_ms']:.2f} dynamic {t['dynamic_ms']:.2f} auto {t['auto_ms']:.2f} aot {t['aot_ms']:.2f} ms" if "eager_ms" in t else ""
        print(f"{name}: auto {_match(auto)} {auto['graphs_per_call']} sess {auto['sessions']} fb {_ops(auto['fallback_ops'])} | "
              f"dyn {_match(dyn)} {dyn['graphs_per_call']} sess {dyn['sessions']} fb {_ops(dyn['fallback_ops'])} |{tim} "
              f"[{auto['seconds']:.0f}+{dyn['seconds']:.0f}+{time.perf_counter() - t0 - auto['seconds'] - dyn['seconds']:.0f} s]", flush=True)
    elapsed = time.perf_counter() - start
    header = (f"# ortlite model zoo, changing shapes\n\n`python bench/zoo.py{' ' + ' '.join(argv if argv is not None else sys.argv[1:])}` — "
              f"{len(names)} models, {elapsed / 60:.1f} min; torch {torch.__version__}, transformers {transformers.__version__}, "
              f"ortlite at {state}; {os.cpu_count()} cores, 1 thread.")
    text = report(results, timings, header)
    print()
    print(text)
    if out:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            f.write(text)
        print(f"written to {out}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"header": header, "results": results, "timings": timings}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
