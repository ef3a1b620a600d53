"""Every causal-LM architecture of the installed transformers, through ortlite: each model type
of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` built from its default config shrunk small (a few
layers, hidden 64, 4 heads, vocabulary 128, 4 experts; random weights, seed 0, eval mode),
called on `input_ids` of shape (1, 12) and compared with eager. Each architecture runs in a
process of its own (`--one`) with a time limit (a timeout is a result), one thread; rows are
saved to --out as they come, and --resume goes on from a sweep cut short.

    python bench/arch_sweep.py                                    # every architecture (hours)
    python bench/arch_sweep.py --only llama,qwen3_moe,gpt_oss --markdown
    python bench/arch_sweep.py --moe-first --resume               # mixtures of experts first; go on
    python bench/arch_sweep.py --report                           # the markdown of --out's rows
    python bench/arch_sweep.py --eager-only                       # do the small models build and run eagerly?
    python bench/arch_sweep.py --one llama                        # one, in this process: JSON lines

Columns per architecture, in the order they run:
  eager      the eager forward runs (or its error)
  tc         torch.compile(backend=ortlite.Backend(ortlite.Options())) under no_grad: logits equal
             eager's (rtol 1e-4, atol 1e-4 x max |logit|); whole: one Dynamo graph, one ONNX
             Runtime graph, nothing left to torch; its graphs and the aten ops left to torch
  aot        ortlite.compile(model, kwargs={"input_ids": ids}) then called on other ids of
             the same shape: right
  dynamic    torch.compile(..., dynamic=True) on (2, 12) then (3, 16): right, graphs (last:
             the slowest to compile, a timeout there keeps the columns before it)
  seconds    first calls of torch.compile and of dynamic=True; ortlite.compile plus its first call
  moe        a module's class is named *Experts*, *MoE* or *Moe*

The small config: the config class's defaults, every field shrunk by its name (sizes scaled with
the hidden size to multiples of 8, head sizes by 8, counts of heads, experts, groups, windows and
chunks clamped, token ids moved inside the small vocabulary), sub-configs (text, vision, audio)
shrunk the same way, then as few layers as keep every kind of layer the defaults have (per-layer
lists, layer index lists, cycles, periods, dense-first counts, shared-KV tails, per-layer
overrides), with the products the defaults hold between head counts and head sizes kept.
Fields the defaults leave None where the model needs a value are filled (NONE_FILLS); a few
attributes need a value by name (ATTRIBUTE_OVERRIDES); model types that need anything of their
own are in MODEL_OVERRIDES, each with its reason.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))

VOCAB = 128  # the small vocabulary; config token ids that do not fit go to its top RESERVED ids
RESERVED = 16  # inputs are drawn from [0, VOCAB - RESERVED)
HIDDEN = 64
HEADS = 4
KV_HEADS = 2  # grouped-query attention stays grouped (and multi-query stays 1, MHA stays 4)
LAYERS = 2  # at least; more where the defaults have more kinds of layers
EXPERTS = 4
TOP_K = 2
GROUPS = 2  # expert groups, SSM groups
WINDOW = 8  # sliding windows and attention chunks: shorter than the sequence
CHUNK = 4  # SSM / LSH / xLSTM chunks: the sequences (12, 16) are multiples
POSITIONS = 512
STATE = 16  # SSM state sizes
SEQ = 12
DYNAMIC_SHAPES = [(2, 12), (3, 16)]  # batch 1 is specialized by Dynamo
RTOL = ATOL = 1e-4

# --- the small config ---------------------------------------------------------------------

TOKEN_RE = re.compile(r"token_id$|token_index$|^(unk|mask)_index$|^lang_id$")
MEDIA_TOKEN_RE = re.compile(r"image|video|audio|vision|^bo[iav]_|^eo[iav]_")
LAYER_FIELDS = (
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_blocks", "decoder_layers",
    "encoder_layers", "num_decoder_layers", "num_encoder_layers",
)
INDEX_LIST_RE = re.compile(r"(layers|idxs|ids|indices|layer_ids)$")
FROM_START_COUNTS = ("first_k_dense_replace", "num_dense_layers", "num_dense_blocks", "first_k_dense")
FROM_END_COUNTS = ("num_kv_shared_layers",)
START_INDEX = ("moe_layer_start_index",)  # layers >= it
END_INDEX = ("moe_layer_end_index",)  # layers <= it
LAYER_REFERENCE_LISTS = ("kv_source_layers",)  # per layer, the index of another layer

# By attribute name: values that no rule derives.
ATTRIBUTE_OVERRIDES = {
    # reformer: the axial position grid's product must cover the sequence, and its
    # embedding dims must sum to the hidden size (the hidden-size scaling keeps the sum)
    "axial_pos_shape": lambda v, ctx: [4, 8],
    # a causal LM is a decoder (BERT-like and reformer LM heads require it)
    "is_decoder": lambda v, ctx: True,
}

# Fields some defaults leave None where the model needs a value (the default config itself
# does not build): filled after the config is made, only where it is still None.
NONE_FILLS = {
    "head_dim": lambda c: c.hidden_size // c.num_attention_heads,
    "num_key_value_heads": lambda c: c.num_attention_heads,
    "n_routed_experts": lambda c: EXPERTS,
    "num_experts": lambda c: EXPERTS,
    "num_local_experts": lambda c: EXPERTS,
    "num_experts_per_tok": lambda c: TOP_K,
    "n_shared_experts": lambda c: 1,
}

# By model type: only what the generic shrinker cannot know; each says why. Values are final
# (no rule applies to them); a callable gets the class defaults; a dict is a sub-config's.
# "_layers_per_kind": keep that many layers of each kind.
_COHERE_COMPASS_ROPE = {  # its rotary embedding reads a per-layer-type entry, [24, 20, 20] sections unless given
    kind: {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]} for kind in ("full_attention", "sliding_attention")
}
_QWEN4_EXP_INDEXER = dict(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=8, indexer_compress_ratio=4)
MODEL_OVERRIDES: dict[str, dict] = {
    # the defaults have no rope_parameters entry per layer type: the model does not build
    "cohere_compass_text": {"rope_parameters": _COHERE_COMPASS_ROPE},
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig does not define:
    # the default config does not build (the value is not used: rotary reads rope_parameters)
    # and clamps q, k, v to attn_config.clip_qkv, which defaults to None: eager raises (8 as DBRX's checkpoints)
    "dbrx": {"attn_config": {"rope_theta": 500000.0, "clip_qkv": 8.0}},
    # the defaults' layer_types is None and nothing derives it: the model does not build
    "lfm2_moe": {"layer_types": lambda raw: ["full_attention" if i % 4 == 3 else "conv" for i in range(raw["num_hidden_layers"])]},
    # the defaults have indexed-attention layers and no indexer sizes: the model does not build
    "qwen4_exp_text": _QWEN4_EXP_INDEXER,
    "qwen4_exp": {"text_config": _QWEN4_EXP_INDEXER},
    # the hybrid layers share one transformer block; transformers ties it from the first
    # hybrid layer to the others by a pattern that must match at least one other
    # the indexer's heads must not outnumber the query heads of one key head (4 // 2)
    "kolibri1_1": {"index_num_heads": 2},
    "zamba": {"_layers_per_kind": 2},
    "zamba2": {"_layers_per_kind": 2},
    # the assistant (drafter) validates that its text config has no per-layer inputs, no MoE
    # block, no double-wide MLP and all layers sharing the target's KV, but its defaults are
    # gemma4_text's, which have them: AutoConfig.for_model("gemma4_assistant") itself raises
    # (num_kv_shared_layers 0: the assistant's config then makes it every layer)
    "gemma4_assistant": {"text_config": dict(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, enable_moe_block=False, use_double_wide_mlp=False, num_kv_shared_layers=0)},
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _round_to(x: float, multiple: int, lo: int) -> int:
    return max(lo, multiple * int(round(x / multiple)))


@dataclasses.dataclass
class _Context:
    raw: dict  # the class defaults (what the default config was made from)
    hidden0: int | None  # the default hidden size
    heads0: int | None
    other_hiddens: frozenset = frozenset()  # the default hidden sizes of the other sub-configs
    scaled: set = dataclasses.field(default_factory=set)  # fields scaled with the hidden size


def _partner_heads(name: str, ctx: _Context):
    """The head count a key/value head count is a divisor of: (default, new)."""
    for partner in (name.replace("key_value", "attention"), name.replace("kv", "attention"), name.replace("key", "value"), "num_attention_heads", "n_head", "num_heads", "n_heads"):
        if partner != name and _is_int(ctx.raw.get(partner)):
            return ctx.raw[partner], _small_value(partner, ctx.raw[partner], ctx)
    return ctx.heads0, HEADS


def _small_value(name: str, v, ctx: _Context):
    """The small value of one field, by its name (ints and lists of ints; the rest unchanged)."""
    n = name.lower()
    if name in ATTRIBUTE_OVERRIDES:
        return ATTRIBUTE_OVERRIDES[name](v, ctx)
    if isinstance(v, (list, tuple)) and v and all(_is_int(x) for x in v) and not TOKEN_RE.search(n) and not INDEX_LIST_RE.search(n):
        small = [_small_value(name, x, ctx) for x in v]
        return type(v)(small) if isinstance(v, tuple) else small
    if not _is_int(v) or v <= 0 or TOKEN_RE.search(n):
        return v
    if re.search(r"multiple|divisible", n):
        return min(v, 8)
    if "vocab" in n:
        return min(v, VOCAB)
    if n in LAYER_FIELDS or n in FROM_START_COUNTS + FROM_END_COUNTS + START_INDEX + END_INDEX:
        return v  # the layer pass decides
    if re.search(r"experts_per_tok|experts_per_token|^moe_topk$|^moe_k$|top_k_experts|^num_selected_experts$|^top_k$|router_topk", n):
        return min(v, TOP_K)
    if re.search(r"shared_experts?$|^(n|num|moe_num)_shared", n):
        return min(v, 1)
    if re.search(r"experts$|expert_num$|^num_experts|n_routed_experts|moe_num_experts", n):
        return min(v, EXPERTS)
    if re.search(r"topk_group", n):
        return min(v, 1)
    if re.search(r"^n_group$|num_expert_group|n_groups$|ngroups$|mamba_n_groups", n):
        return min(v, GROUPS)
    if re.search(r"key_value_heads|kv_heads$|^num_query_groups$|linear_num_key_heads|multi_query_group_num", n):
        default, new = _partner_heads(name, ctx)
        return new if v == default else 1 if v == 1 else min(KV_HEADS, new)
    if re.search(r"heads?$|heads_per", n) and not re.search(r"dim|size", n):
        return min(v, HEADS)
    if re.search(r"head_dim|head_size|headdim|d_head|dim_head|kv_channels|^qk_.*dim$|^v_.*dim$|rope_dim|rotary_dim|nope", n):
        return _round_to(v / 8, 4, 8)
    if re.search(r"state_size$|d_state$|ssm_state|state_dim$", n):
        return min(v, STATE)
    if re.search(r"conv|kernel", n):
        return v
    if re.search(r"sliding_window|window_size|window_len|attention_chunk_size|local_window|attention_window", n):
        return min(v, WINDOW)
    if re.search(r"chunk_size$|chunk_length$|chunk_len$|chunksize$", n) and not re.search(r"^max_|feed_forward|lm_head", n):
        return min(v, CHUNK)
    if re.search(r"max_position|n_positions|^n_ctx$|max_seq|context_length|max_(source|target)_positions|max_length$", n):
        return min(v, POSITIONS)
    if re.search(r"_period$|_interval$|sparse_step$|_step$|every_n_layers|_pattern$", n):
        return min(v, 2)
    if re.search(r"_offset$", n):
        return v % 2
    if re.search(r"index_topk$|indexer_topk$|token_budget|indexer_budget|num_local_tokens$", n):
        return min(v, WINDOW)  # tokens a sparse attention selects: fewer than the sequence
    if v in ctx.other_hiddens and SIZE_RE.search(n):
        return HIDDEN  # (a vision projector's output: the text model's width)
    if ctx.hidden0 and v > 16 and SIZE_RE.search(n):
        if v == ctx.hidden0:
            return HIDDEN
        ctx.scaled.add(name)
        return _round_to(v * HIDDEN / ctx.hidden0, 8, 8)  # (grouped_mm wants 16-byte strides)
    return v


SIZE_RE = re.compile(
    r"^(?!.*(image|patch|pixel|bucket|channels|vocab|heads?$|experts|position)).*(size|dim|d_ssm|width|hidden|inner|rank|embd|embed|(^|_|d)ffn?(_|$)|intermediate|proj|d_model|^dim$|lora|latent)"
)
HIDDEN_FIELDS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "emb_dim", "embedding_dim", "model_dim", "hidden_dim")
HEAD_FIELDS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "attention_heads")
HEAD_COUNT_RE = re.compile(r"heads?$")
HEAD_DIM_RE = re.compile(r"head_dim|head_size|headdim|d_head|dim_head|kv_channels")


def _keep_products(ctx: _Context, small: dict) -> None:
    """Where the defaults have heads x head size == another size (the hidden size, mamba's
    expand x hidden, a d_ssm), the small config has it too: the head size is re-derived."""
    raw = ctx.raw
    ints = {k: v for k, v in raw.items() if _is_int(v) and v > 0}
    totals = {k: (v, small.get(k, v)) for k, v in ints.items() if re.search(r"hidden|ssm|inner|d_model|embd|embed_dim", k.lower())}
    for expand in ("expand", "mamba_expand"):
        if _is_int(raw.get(expand)) and ctx.hidden0:
            totals[f"{expand}*hidden"] = (raw[expand] * ctx.hidden0, raw[expand] * HIDDEN)
    for d in ints:
        if not HEAD_DIM_RE.search(d.lower()):
            continue
        prefix = d.split("_")[0]
        candidates = [h for h in ints if HEAD_COUNT_RE.search(h.lower()) and not HEAD_DIM_RE.search(h.lower()) and not re.search(r"kv|key", h.lower())]
        candidates.sort(key=lambda h: (h.split("_")[0] != prefix, h))  # same prefix (mamba_, linear_) first
        for h in candidates:
            product = ints[h] * ints[d]
            for t, (t0, t1) in totals.items():
                if t in (h, d) or t0 != product:
                    continue
                heads = small.get(h, ints[h])
                if t1 % heads == 0 and t1 // heads >= 2:
                    small[d] = t1 // heads
                    break
            else:
                continue
            break


def _class_defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _config_dict(config) -> dict:
    """A config's values, per-layer attributes of heterogeneous configs included."""
    try:
        return config.to_dict()
    except Exception:
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}


def _layer_signature_parts(instance, fields: set, L: int) -> tuple[dict, dict, list]:
    """From a config made with the default number of layers L: its per-layer lists (name ->
    list), its layer index lists (name -> list of indices) and a per-layer signature list."""
    values = _config_dict(instance)
    per_layer, index_lists, flags = {}, {}, []
    for name, v in values.items():
        if name not in fields or not isinstance(v, (list, tuple)):
            continue
        n = name.lower()
        if TOKEN_RE.search(n) or n in ("architectures",):
            continue
        ints = all(_is_int(x) for x in v)
        if INDEX_LIST_RE.search(n) and ints and list(v) == sorted(set(v)) and all(0 <= x < L for x in v) and name not in LAYER_REFERENCE_LISTS:
            index_lists[name] = list(v)
            flags.append([i in v for i in range(L)])
        elif len(v) == L:
            per_layer[name] = list(v)
            if name in LAYER_REFERENCE_LISTS:
                flags.append([v[i] == i for i in range(L)])
            else:
                flags.append([json.dumps(x, sort_keys=True, default=str) for x in v])
        elif 0 < len(v) < L and "types" in n and all(isinstance(x, str) for x in v):
            flags.append([v[i % len(v)] for i in range(L)])  # a cycle of layer kinds (recurrent_gemma)
    for name in FROM_START_COUNTS:
        if _is_int(values.get(name)) and name in fields:
            flags.append([i < values[name] for i in range(L)])
    for name in FROM_END_COUNTS:
        if _is_int(values.get(name)) and name in fields and values[name] > 0:
            flags.append([i >= L - values[name] for i in range(L)])
    for name in START_INDEX:
        if _is_int(values.get(name)) and name in fields:
            flags.append([i >= values[name] for i in range(L)])
    for name in END_INDEX:
        if _is_int(values.get(name)) and name in fields and values[name] >= 0:
            flags.append([i <= values[name] for i in range(L)])
    plc = values.get("per_layer_config")
    if isinstance(plc, dict) and plc:
        flags.append([json.dumps(plc.get(f"{i:02d}", plc.get(str(i), plc.get(i))), sort_keys=True, default=str) for i in range(L)])
    signature = [tuple(f[i] for f in flags) for i in range(L)]
    return per_layer, index_lists, signature


def _choose_layers(signature: list, per_layer: dict, per_kind: int = 1) -> list[int]:
    """The layers kept: as few as have every signature (per_kind of each), a prefix where one does."""
    L = len(signature)
    kinds = list(dict.fromkeys(signature))
    want = max(len(kinds) * per_kind, LAYERS)
    prefix = signature[:want]
    if all(prefix.count(k) >= min(per_kind, signature.count(k)) for k in kinds):
        chosen = list(range(min(L, want)))
    else:
        chosen = sorted(i for k in kinds for i in [j for j, s in enumerate(signature) if s == k][:per_kind])
        for i in range(L):
            if len(chosen) >= LAYERS:
                break
            if i not in chosen:
                chosen = sorted(chosen + [i])
    for name in LAYER_REFERENCE_LISTS:  # a layer reading another's KV keeps that one
        if name in per_layer:
            chosen = sorted(set(chosen) | {per_layer[name][i] for i in chosen})
    return chosen


def _layer_changes(instance, cls, raw: dict, chosen: list[int], L: int, per_layer: dict, index_lists: dict) -> dict:
    values = _config_dict(instance)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    k = len(chosen)
    new_index = {old: new for new, old in enumerate(chosen)}
    out = {}
    for name in LAYER_FIELDS:
        if name in fields and _is_int(raw.get(name)) and raw[name] > 0:
            out[name] = k if raw[name] >= L or raw[name] > k else raw[name]
    for name, v in per_layer.items():
        kept = [v[i] for i in chosen]
        if name in LAYER_REFERENCE_LISTS:
            kept = [new_index[x] for x in kept]
        out[name] = kept
    for name, v in values.items():  # cycles of layer kinds shorter than the layers: one per layer kept
        if name in fields and name not in per_layer and isinstance(v, list) and 0 < len(v) < L and "types" in name.lower() and all(isinstance(x, str) for x in v):
            out[name] = [v[i % len(v)] for i in chosen]
    for name, v in index_lists.items():
        out[name] = [new_index[i] for i in v if i in new_index]
    for name in FROM_START_COUNTS:
        if name in fields and _is_int(values.get(name)):
            out[name] = sum(1 for i in chosen if i < values[name])
    for name in FROM_END_COUNTS:
        if name in fields and _is_int(values.get(name)) and values[name] > 0:
            out[name] = sum(1 for i in chosen if i >= L - values[name])
    for name in START_INDEX:
        if name in fields and _is_int(values.get(name)):
            out[name] = sum(1 for i in chosen if i < values[name])
    for name in END_INDEX:
        if name in fields and _is_int(values.get(name)) and values[name] >= 0:
            out[name] = sum(1 for i in chosen if i <= values[name]) - 1
    if "attention_types" in fields and isinstance(values.get("attention_types"), list):  # gpt_neo: [[kinds, repeats]]
        pattern = values["attention_types"][0][0]
        out["attention_types"] = [[pattern, max(1, k // len(pattern))]]
    return out


def _small_per_layer_config(plc: dict, chosen: list[int], ctx: _Context) -> dict:
    new_index = {old: new for new, old in enumerate(chosen)}
    out = {}
    for key, overrides in plc.items():
        i = int(key)
        if i in new_index:
            layer_ctx = dataclasses.replace(ctx, raw={**ctx.raw, **overrides})
            out[new_index[i]] = {name: _small_value(name, v, layer_ctx) for name, v in overrides.items()}
    return out


def small_config(model_type: str):
    """The default config of model_type, shrunk (see the module's docstring)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return _small(CONFIG_MAPPING[model_type], {}, MODEL_OVERRIDES.get(model_type, {}), token_map={}, other_hiddens=frozenset())


def _sub_configs(cls) -> dict:
    """key -> (sub-config class, the values its parent gives it by default)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    specs = dict(getattr(cls, "sub_configs_defaults", {}) or {})
    for key in _sub_keys(cls):  # older composite configs name only the class (dbrx)
        specs.setdefault(key, None)
    if not specs:
        return {}
    try:
        default = cls()
    except Exception:
        default = None
    out = {}
    for key, spec in specs.items():
        sub = getattr(default, key, None) if default is not None else None
        if sub is not None and hasattr(sub, "to_dict"):
            out[key] = (type(sub), _config_dict(sub))
            continue
        if spec is None:
            out[key] = (cls.sub_configs[key], {})
            continue
        sub_cls = CONFIG_MAPPING[spec.model_type] if spec.config_class is AutoConfig else spec.config_class
        out[key] = (sub_cls, dict(spec.init_kwargs or {}))
    return out


def _sub_keys(cls) -> list[str]:
    try:
        subs = cls.sub_configs
    except Exception:
        subs = {}
    return list(subs or {}) if isinstance(subs, dict) else []


def _keep_divisible(ctx: _Context, changes: dict) -> None:
    """A size scaled with the hidden size that the defaults make a multiple of another field
    stays one, rounded up by at most 2x (kolibri1_1's index pool, a multiple of its compression)."""
    raw = ctx.raw
    for a in sorted(ctx.scaled):
        if not _is_int(changes.get(a)):
            continue
        for b, b0 in raw.items():
            if b == a or not _is_int(b0) or b0 < 2 or raw[a] <= b0 or raw[a] % b0:
                continue
            if not (SIZE_RE.search(b.lower()) or HEAD_DIM_RE.search(b.lower()) or re.search(r"compress|ratio", b.lower())):
                continue
            b1 = changes.get(b, b0)
            if _is_int(b1) and b1 >= 2 and changes[a] % b1:
                step = math.lcm(b1, 8)
                bumped = -(-changes[a] // step) * step
                if bumped <= 2 * changes[a]:
                    changes[a] = bumped


def _get(config, name):
    try:  # (a per-layer attribute of a heterogeneous config raises on global access)
        return getattr(config, name, None)
    except Exception:
        return None


def _head_dim(config) -> int | None:
    head_dim = _get(config, "head_dim")
    if not _is_int(head_dim):
        try:
            head_dim = config.hidden_size // config.num_attention_heads
        except Exception:
            return None
    return head_dim


def _fit_mrope(rope, head_dim: int | None):
    """Multimodal rotary sections (summing to half the rotary size) scaled to the small head size."""
    if not isinstance(rope, dict) or head_dim is None:
        return rope
    out = {}
    for key, v in rope.items():
        if isinstance(v, dict):
            out[key] = _fit_mrope(v, head_dim)
        elif key == "mrope_section" and isinstance(v, list) and v:
            half = int(head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
            total = sum(v)
            if total != half and half >= len(v):
                new = [max(1, x * half // total) for x in v]
                new[0] += half - sum(new)
                v = new
            out[key] = v
        else:
            out[key] = v
    return out


def _raw(cls, given: dict) -> dict:
    """cls's defaults, with what a composite parent gives it (derived values aside)."""
    raw = _class_defaults(cls)
    for name, v in given.items():
        if name in raw and raw[name] is not None and v != raw[name] and not isinstance(v, dict):
            raw[name] = v
    return raw


def _hidden(raw: dict) -> int | None:
    return next((raw[h] for h in HIDDEN_FIELDS if _is_int(raw.get(h))), None)


def _small(cls, given: dict, overrides: dict, token_map: dict, other_hiddens: frozenset):
    """cls's config shrunk; `given`: values a composite parent gives it."""
    raw = _raw(cls, given)
    sub_keys = _sub_configs(cls)
    sub_hiddens = {_hidden(_raw(c, g)) for c, g in sub_keys.values()} - {None}
    hidden0 = _hidden(raw)
    heads0 = next((raw[h] for h in HEAD_FIELDS if _is_int(raw.get(h))), None)
    ctx = _Context(raw, hidden0, heads0, frozenset(other_hiddens | sub_hiddens) - {hidden0})
    changes = {}
    for name, v in raw.items():
        new = _small_value(name, v, ctx)
        if new != v:
            changes[name] = new
    _keep_products(ctx, changes)
    _keep_divisible(ctx, changes)
    final = {k: (v(raw) if callable(v) else v) for k, v in overrides.items() if not k.startswith("_") and not (k in sub_keys and isinstance(v, dict))}
    changes.update(final)
    # sub-configs (text, vision, audio, ...): the default ones, shrunk the same way
    for key, (sub_cls, sub_given) in sub_keys.items():
        changes[key] = _small(sub_cls, sub_given, overrides.get(key, {}), token_map, frozenset(other_hiddens | sub_hiddens))
    _move_token_ids(raw, changes, token_map)
    # the per-layer pass: made with every default layer, then the layers kept chosen
    first = cls(**changes)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    for name, fill in NONE_FILLS.items():
        if name in fields and name in _config_dict(first) and _config_dict(first)[name] is None:
            try:
                changes[name] = fill(first)
            except Exception:
                pass
    if "rope_parameters" in fields and "rope_parameters" not in final and isinstance(getattr(first, "rope_parameters", None), dict):
        fitted = _fit_mrope(first.rope_parameters, _head_dim(first))
        if fitted != first.rope_parameters:
            changes["rope_parameters"] = fitted
    L = getattr(first, "num_hidden_layers", None)
    if not _is_int(L):
        L = next((raw[f] for f in LAYER_FIELDS if _is_int(raw.get(f))), None)
    if not _is_int(L) or L <= 0:
        return cls(**changes)
    per_layer, index_lists, signature = _layer_signature_parts(first, fields, L)
    chosen = _choose_layers(signature, per_layer, overrides.get("_layers_per_kind", 1))
    changes.update(_layer_changes(first, cls, raw, chosen, L, per_layer, index_lists))
    plc = _config_dict(first).get("per_layer_config")
    if isinstance(plc, dict) and plc:
        changes["per_layer_config"] = _small_per_layer_config(plc, chosen, ctx)
    return cls(**changes)


def _move_token_ids(raw: dict, changes: dict, token_map: dict) -> None:
    """Token ids past the small vocabulary (and media tokens) to its top RESERVED ids, one id
    per default id across the whole config (so ids equal by default stay equal)."""

    def move(name, v):
        if not _is_int(v) or v < 0:
            return v
        if v < VOCAB - RESERVED and not MEDIA_TOKEN_RE.search(name.lower()):
            return v
        if v not in token_map:
            token_map[v] = VOCAB - 1 - len(token_map) % RESERVED
        return token_map[v]

    for name, v in raw.items():
        if not TOKEN_RE.search(name.lower()):
            continue
        new = [move(name, x) for x in v] if isinstance(v, list) else move(name, v)
        if new != v:
            changes[name] = new


def _set_everywhere(config, name: str, value) -> None:
    seen = set()

    def visit(c):
        if id(c) in seen:
            return
        seen.add(id(c))
        if hasattr(c, name):
            try:
                setattr(c, name, value)
            except Exception:
                pass
        for key in _sub_keys(type(c)):
            sub = getattr(c, key, None)
            if sub is not None and hasattr(sub, "to_dict"):
                visit(sub)

    visit(config)


# --- one architecture ---------------------------------------------------------------------


def _short(e: BaseException, n: int = 200) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:  # (transformers' validation errors: the cause is next)
        text += " " + lines[1]
    return f"{type(e).__name__}: {text}"[:n]


def _logits(out):
    if hasattr(out, "logits") and out.logits is not None:
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    if isinstance(out, dict):
        return next(iter(out.values()))
    return out


def _compare(actual, expected) -> tuple[bool, float, str]:
    import torch

    actual, expected = _logits(actual), _logits(expected)
    if not isinstance(actual, torch.Tensor):
        return False, float("nan"), f"output {type(actual).__name__}"
    diff = (actual.float() - expected.float()).abs().max().item() if actual.shape == expected.shape and actual.numel() else 0.0
    atol = ATOL * max(1.0, expected.abs().max().item()) if expected.numel() else ATOL
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=atol, equal_nan=True)
        return True, diff, ""
    except AssertionError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return False, diff, "; ".join(lines[:3])[:200]


def _config_counts_experts(model_type: str) -> bool:
    try:
        return is_moe(small_config(model_type), None)
    except Exception:
        return False


def is_moe(config, model) -> bool:
    """Mixture of experts: a module whose class is named *Experts*, *MoE* or *Moe*."""
    seen = []

    def counts(c):
        if id(c) in seen:
            return False
        seen.append(id(c))
        values = _config_dict(c)
        for name in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
            if _is_int(values.get(name)) and values[name] > 1:
                return True
        return any(counts(getattr(c, key)) for key in _sub_keys(type(c)) if hasattr(getattr(c, key, None), "to_dict"))

    if model is None:  # (before building: the run order of --moe-first)
        return counts(config)
    # built: a module of the experts' kind (a config may count experts for layers it does not make)
    return any(re.search(r"Experts|MoE|Moe", type(m).__name__) for m in model.modules())


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        message = record.getMessage().splitlines()[0]
        if message.startswith("ortlite: graph with [") and "] runs in torch: " in message:
            message = "ortlite: a graph failed to compile, runs in torch: " + message.split("] runs in torch: ", 1)[1]
        message = message[:300]
        if message not in self.messages:
            self.messages.append(message)


def build(model_type: str):
    """(model, config): the small model in eval mode, float32, random weights."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = small_config(model_type)
    _set_everywhere(config, "use_cache", False)
    torch.manual_seed(0)
    model_cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    wanted = getattr(model_cls, "config_class", None)
    if wanted is not None and not isinstance(config, wanted):
        # a composite config whose causal LM takes one of its sub-configs other than
        # text_config (AutoModelForCausalLM only redirects text_config): e.g. musicgen's decoder
        for key in _sub_keys(type(config)):
            if key != "text_config" and isinstance(getattr(config, key, None), wanted):
                config = getattr(config, key)
                break
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except ValueError as e:
        if "Unrecognized configuration class" not in str(e):
            raise
        model = model_cls._from_config(config, dtype=torch.float32)
    return model.float().eval(), config


def _ids(shape, seed, config=None):
    """input_ids of (batch, length); models of several codebooks (musicgen) take a row per
    codebook of each batch item."""
    import torch

    codebooks = getattr(config, "num_codebooks", None) if config is not None else None
    if _is_int(codebooks) and codebooks > 1:
        shape = (shape[0] * codebooks, shape[1])
    return torch.randint(0, VOCAB - RESERVED, shape, generator=torch.Generator().manual_seed(seed))


def _prepare(model, config) -> None:
    """What a user calls before a forward: X-MOD's adapters need a language."""
    if hasattr(model, "set_default_language") and getattr(config, "languages", None):
        model.set_default_language(config.default_language or config.languages[0])


def run_one(model_type: str, emit) -> dict:
    """The row of one architecture; emit(row) after each step (what a timeout leaves)."""
    import torch
    import transformers

    import ortlite

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    for name in ("torch._dynamo", "torch._inductor", "torch.fx", "torch.export"):
        logging.getLogger(name).setLevel(logging.ERROR)
    collect = _Collect()
    ort_log = logging.getLogger("ortlite")
    ort_log.addHandler(collect)
    ort_log.propagate = False
    ort_log.setLevel(logging.WARNING)

    row: dict = {"model_type": model_type, "step": "build"}

    def step(name):
        row["step"] = name
        row["warnings"] = collect.messages[:8]
        emit(row)

    step("build")
    try:
        model, config = build(model_type)
    except Exception as e:
        row["build"] = _short(e)
        row["build_trace"] = traceback.format_exc().strip().splitlines()[-1][:300]
        step("done")
        return row
    row["build"] = "ok"
    row["class"] = type(model).__name__
    row["params"] = sum(p.numel() for p in model.parameters())
    row["moe"] = is_moe(config, model)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    row["layers"] = getattr(text, "num_hidden_layers", None)

    _prepare(model, config)
    ids, other = _ids((1, SEQ), 0, config), _ids((1, SEQ), 1, config)
    step("eager")
    try:
        with torch.no_grad():
            expected = model(input_ids=ids)
            expected_other = model(input_ids=other)
        row["eager"] = "ok"
    except Exception as e:
        row["eager"] = _short(e)
        step("done")
        return row

    # torch.compile, static shapes
    step("torch.compile")
    _reset_dynamo()
    backend = ortlite.Backend(ortlite.Options())
    try:
        fast = torch.compile(model, backend=backend)
        start = time.perf_counter()
        with torch.no_grad():
            got = fast(input_ids=ids)
        row["tc_seconds"] = round(time.perf_counter() - start, 2)
        row["tc_right"], row["tc_max_diff"], why = _compare(got, expected)
        if why:
            row["tc_wrong"] = why
    except Exception as e:
        row["tc_error"] = _short(e)
    stats = backend.stats
    row["tc_graphs"] = stats.graphs
    row["tc_fallback"] = dict(stats.fallback_ops)
    row["tc_reasons"] = _reasons(backend)
    row["tc_dynamo_graphs"] = _dynamo_graphs()
    row["tc_breaks"] = _graph_breaks()
    row["tc_whole"] = bool(row.get("tc_right")) and stats.graphs == 1 and not stats.fallback_ops and row["tc_dynamo_graphs"] in (1, None)

    # ahead of time: compiled on ids, called on other ids of the same shape
    step("aot")
    try:
        start = time.perf_counter()
        with torch.no_grad():
            compiled = ortlite.compile(model, (), {"input_ids": ids})
            got = compiled(input_ids=other)
        row["aot_seconds"] = round(time.perf_counter() - start, 2)
        row["aot_right"], row["aot_max_diff"], why = _compare(got, expected_other)
        if why:
            row["aot_wrong"] = why
    except Exception as e:
        row["aot_error"] = _short(e)
        row["aot_right"] = False
    # torch.compile, dynamic=True over two batch sizes and lengths
    step("dynamic")
    _reset_dynamo()
    backend = ortlite.Backend(ortlite.Options())
    try:
        fast = torch.compile(model, backend=backend, dynamic=True)
        rights = []
        for i, shape in enumerate(DYNAMIC_SHAPES):
            x = _ids(shape, 10 + i, config)
            with torch.no_grad():
                want = model(input_ids=x)
                start = time.perf_counter()
                got = fast(input_ids=x)
                if i == 0:
                    row["dyn_seconds"] = round(time.perf_counter() - start, 2)
            right, _, why = _compare(got, want)
            rights.append(right)
            if why and "dyn_wrong" not in row:
                row["dyn_wrong"] = f"{shape}: {why}"
        row["dyn_right"] = all(rights)
    except Exception as e:
        row["dyn_error"] = _short(e)
    stats = backend.stats
    row["dyn_graphs"] = stats.graphs
    row["dyn_fallback"] = dict(stats.fallback_ops)
    row["dyn_dynamo_graphs"] = _dynamo_graphs()
    torch._dynamo.reset()

    step("done")
    return row


def _reasons(backend) -> dict:
    """aten op left to torch -> the first reason given."""
    out = {}
    for report in backend.graph_reports:
        for op, why, _ in report.torch_ops:
            out.setdefault(op, str(why)[:160])
    return out


def _reset_dynamo() -> None:
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def _graph_breaks() -> list[str]:
    try:
        from torch._dynamo.utils import counters

        return [str(why).splitlines()[0][:160] for why in list(counters["graph_break"])[:3]]
    except Exception:
        return []


def _dynamo_graphs():
    try:
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"]
    except Exception:
        return None


def eager_only(model_types: list[str]) -> list[dict]:
    """In this process: does each small model build, and its eager forward run?"""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rows = []
    for mt in model_types:
        row = {"model_type": mt}
        try:
            model, config = build(mt)
            row.update(build="ok", params=sum(p.numel() for p in model.parameters()), moe=is_moe(config, model))
            text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
            row["layers"] = getattr(text, "num_hidden_layers", None)
        except Exception as e:
            row["build"] = _short(e, 300)
        if row["build"] == "ok":
            try:
                _prepare(model, config)
                with torch.no_grad():
                    model(input_ids=_ids((1, SEQ), 0, config))
                row["eager"] = "ok"
            except Exception as e:
                row["eager"] = _short(e, 300)
            del model
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# --- the sweep ----------------------------------------------------------------------------


def model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _last_row(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def sweep(names: list[str], timeout: float, jobs: int, progress=None) -> list[dict]:
    """Each model type in a subprocess (`--one`), at most `jobs` at a time, `timeout` s each."""
    pending = list(names)
    running: list[tuple[str, subprocess.Popen, float, str]] = []
    results: dict[str, dict] = {}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        while pending or running:
            while pending and len(running) < jobs:
                name = pending.pop(0)
                out_path = os.path.join(tmp, f"{name}.out")
                out = open(out_path, "w")
                proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", name], stdout=out, stderr=subprocess.PIPE, text=True)
                out.close()
                running.append((name, proc, time.perf_counter(), out_path))
            time.sleep(0.2)
            for entry in list(running):
                name, proc, start, out_path = entry
                timed_out = time.perf_counter() - start > timeout
                if proc.poll() is None and not timed_out:
                    continue
                if timed_out and proc.poll() is None:
                    proc.kill()
                _, stderr = proc.communicate()
                running.remove(entry)
                row = _last_row(open(out_path).read()) or {"model_type": name, "step": "start"}
                row["wall_seconds"] = round(time.perf_counter() - start, 1)
                if row.get("step") != "done":
                    if timed_out:
                        row["timeout"] = row.get("step")
                    else:
                        tail = " | ".join((stderr or "").strip().splitlines()[-2:])[:200]
                        row["died"] = f"{row.get('step')}: exit {proc.returncode}: {tail}"
                results[name] = row
                if progress:
                    progress(row)
    return [results[n] for n in names]


# --- the report ---------------------------------------------------------------------------


def status(row: dict) -> dict:
    """Derived cells: what each column shows for a row."""
    s = {}
    if row.get("build") != "ok":
        s["eager"] = "no build" if "build" in row else "timeout" if row.get("timeout") else "died"
        return s
    if row.get("eager") != "ok":
        s["eager"] = "timeout" if row.get("timeout") == "eager" else "died" if row.get("died", "").startswith("eager") else "error"
    else:
        s["eager"] = "ok"
    return s


def cause(row: dict) -> str:
    """Why a row whose eager forward runs is not right and whole, or not right ahead of time."""
    if row.get("timeout") and row["timeout"] != "dynamic":
        return f"timeout in {row['timeout']}"
    if row.get("died") and row.get("step") != "dynamic":
        return f"died: {row['died']}"
    parts = []
    if row.get("tc_error"):
        parts.append(f"torch.compile: {row['tc_error']}")
    elif row.get("tc_right") is False:
        parts.append(f"torch.compile wrong: {row.get('tc_wrong', '')}")
    elif row.get("tc_fallback"):
        reasons = row.get("tc_reasons", {})
        failed = next((w.split("runs in torch: ", 1)[1] for w in row.get("warnings", []) if "a graph failed to compile" in w), None)
        real = [op for op in row["tc_fallback"] if reasons.get(op) != "graph failed to compile"]
        if real:
            op = real[0]
            parts.append(f"`{op}` in torch ({reasons[op]})" if reasons.get(op) else f"`{op}` in torch")
        elif failed:
            parts.append(f"a graph fails to compile: {failed}")
        else:
            parts.append(f"`{next(iter(row['tc_fallback']))}` in torch")
    elif row.get("tc_graphs", 1) != 1 or row.get("tc_dynamo_graphs") not in (1, None):
        breaks = row.get("tc_breaks") or []
        parts.append(f"{row.get('tc_dynamo_graphs')} Dynamo graphs" + (f" (graph break: {breaks[0]})" if breaks else ""))
    if row.get("aot_error"):
        parts.append(f"AOT: {row['aot_error'].split(', from File')[0].split(' from File')[0]}")
    elif row.get("aot_right") is False:
        parts.append(f"AOT wrong: {row.get('aot_wrong', '')}")
    elif "aot_right" not in row:
        parts.append("AOT not reached")
    return "; ".join(parts)


def dynamic_cause(row: dict) -> str:
    """Why dynamic=True is not right in one graph ("" where it is)."""
    if row.get("timeout") == "dynamic":
        return "timeout"
    if row.get("died") and row.get("step") == "dynamic":
        return f"died: {row['died']}"
    if row.get("dyn_error"):
        return row["dyn_error"]
    if row.get("dyn_right") is False:
        return f"wrong: {row.get('dyn_wrong', '')}"
    if row.get("dyn_fallback"):
        return f"`{next(iter(row['dyn_fallback']))}` in torch"
    if row.get("dyn_graphs", 1) != 1:
        return f"{row['dyn_graphs']} graphs"
    return ""


def summarize(rows: list[dict]) -> dict:
    built = [r for r in rows if r.get("build") == "ok"]
    runs = [r for r in built if r.get("eager") == "ok"]

    def pct(n, d):
        return round(100 * n / d, 1) if d else 0.0

    tc_right = [r for r in runs if r.get("tc_right")]
    whole = [r for r in runs if r.get("tc_whole")]
    aot = [r for r in runs if r.get("aot_right")]
    dyn = [r for r in runs if r.get("dyn_right")]
    dyn_one = [r for r in runs if r.get("dyn_right") and r.get("dyn_graphs") == 1 and not r.get("dyn_fallback")]
    moe = [r for r in runs if r.get("moe")]
    return {
        "architectures": len(rows),
        "built": len(built),
        "eager_runs": len(runs),
        "tc_right": len(tc_right), "tc_right_pct": pct(len(tc_right), len(runs)),
        "whole": len(whole), "whole_pct": pct(len(whole), len(runs)),
        "aot_right": len(aot), "aot_right_pct": pct(len(aot), len(runs)),
        "dynamic_right": len(dyn), "dynamic_one_graph": len(dyn_one),
        "moe": len(moe),
        "moe_whole": sum(1 for r in moe if r.get("tc_whole")),
        "moe_aot": sum(1 for r in moe if r.get("aot_right")),
        "moe_whole_and_aot": sum(1 for r in moe if r.get("tc_whole") and r.get("aot_right")),
        "over_60s": {r["model_type"]: max(r.get("tc_seconds") or 0, r.get("aot_seconds") or 0, r.get("dyn_seconds") or 0, 300 if r.get("timeout") else 0) for r in runs
                     if max(r.get("tc_seconds") or 0, r.get("aot_seconds") or 0, r.get("dyn_seconds") or 0) > 60 or r.get("timeout")},
        "dynamic_not_one_right_graph": {r["model_type"]: dynamic_cause(r) for r in runs if dynamic_cause(r)},
        "not_built": {r["model_type"]: r.get("build") or r.get("timeout") or r.get("died") for r in rows if r.get("build") != "ok"},
        "eager_fails": {r["model_type"]: r.get("eager") or f"timeout in {r.get('timeout')}" or r.get("died") for r in built if r.get("eager") != "ok"},
        "not_right_or_whole": {r["model_type"]: cause(r) for r in runs if not (r.get("tc_right") and r.get("tc_whole") and r.get("aot_right"))},
    }


def _cell(v, fmt="{}"):
    if v is None:
        return ""
    if v is True:
        return "yes"
    if v is False:
        return "**no**"
    return fmt.format(v)


def markdown(rows: list[dict], summary: dict) -> str:
    s = summary
    lines = [
        f"Of {s['architectures']} architectures, {s['built']} build small and {s['eager_runs']} run eagerly. Of those: "
        f"torch.compile right {s['tc_right']} ({s['tc_right_pct']}%), whole {s['whole']} ({s['whole_pct']}%), "
        f"`ortlite.compile` right {s['aot_right']} ({s['aot_right_pct']}%), `dynamic=True` right {s['dynamic_right']} "
        f"(one graph, nothing in torch: {s['dynamic_one_graph']}). MoE: {s['moe']}, of which whole {s['moe_whole']}, "
        f"AOT right {s['moe_aot']}, both {s['moe_whole_and_aot']}. Over 60 s to compile (a first call, or timed out): {', '.join(f'{k} ({v:.0f} s)' for k, v in s['over_60s'].items()) or 'none'}.",
        "",
        "| model type | MoE | eager | tc right | whole | graphs | left to torch | AOT right | dynamic right | dyn graphs | tc s | AOT s | dyn s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("build") != "ok" or r.get("eager") != "ok":
            why = r.get("build") if r.get("build") != "ok" else r.get("eager")
            why = why or (f"timeout in {r['timeout']}" if r.get("timeout") else r.get("died", ""))
            what = "no build" if r.get("build") != "ok" else "fails"
            lines.append(f"| {r['model_type']} | {'yes' if r.get('moe') else ''} | {what}: {_md(why, 90)} | | | | | | | | | | |")
            continue
        ops = sorted(r.get("tc_fallback") or {}, key=lambda op: (r.get("tc_reasons", {}).get(op) == "graph failed to compile", op))
        fallback = ", ".join(f"`{op.replace('aten.', '')}`" for op in ops[:3]) + (f" +{len(ops) - 3}" if len(ops) > 3 else "")
        tc_right = _cell(r.get("tc_right")) if "tc_error" not in r else "error"
        dyn = "timeout" if r.get("timeout") == "dynamic" else _cell(r.get("dyn_right")) if "dyn_error" not in r else "error"
        aot = _cell(r.get("aot_right")) if "aot_error" not in r else "error"
        lines.append(
            f"| {r['model_type']} | {'yes' if r.get('moe') else ''} | ok | {tc_right} | {_cell(r.get('tc_whole'))} | {_cell(r.get('tc_graphs'))} | {fallback} | "
            f"{aot} | {dyn} | {_cell(r.get('dyn_graphs'))} | {_cell(r.get('tc_seconds'))} | {_cell(r.get('aot_seconds'))} | {_cell(r.get('dyn_seconds'))} |"
        )
    lines += ["", "Not right, not whole or not right ahead of time, by cause:", ""]
    by_cause = collections.defaultdict(list)
    for mt, why in s["not_right_or_whole"].items():
        by_cause[why].append(mt)
    for why, mts in sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"- {_md(why, 200)}: {', '.join(mts)}")
    if s["dynamic_not_one_right_graph"]:
        lines += ["", "`dynamic=True` not right in one graph:", ""]
        by_cause = collections.defaultdict(list)
        for mt, why in s["dynamic_not_one_right_graph"].items():
            by_cause[why].append(mt)
        for why, mts in sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"- {_md(why, 200)}: {', '.join(mts)}")
    if s["not_built"]:
        lines += ["", "Not built:", ""] + [f"- {mt}: {_md(why, 200)}" for mt, why in s["not_built"].items()]
    if s["eager_fails"]:
        lines += ["", "Eager fails at the small size:", ""] + [f"- {mt}: {_md(why, 200)}" for mt, why in s["eager_fails"].items()]
    return "\n".join(lines) + "\n"


def _md(text, n):
    return str(text or "").replace("|", "\\|").replace("\n", " ")[:n]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated model types (default: every causal-LM model type)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per architecture, all its steps")
    parser.add_argument("--jobs", type=int, default=1, help="architectures at a time (each one thread)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "arch_sweep.json"))
    parser.add_argument("--markdown", action="store_true", help="print the table and the summary as markdown")
    parser.add_argument("--eager-only", action="store_true", help="only build each small model and run it eagerly, all in this process")
    parser.add_argument("--one", help="one model type in this process; prints its row as JSON lines")
    parser.add_argument("--resume", action="store_true", help="keep the rows --out already has; run the others")
    parser.add_argument("--report", action="store_true", help="run nothing: print the markdown of --out")
    parser.add_argument("--moe-first", action="store_true", help="run the architectures whose small config counts experts first")
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one, lambda row: print(json.dumps(row, default=str), flush=True))
        return
    if args.report:
        saved = json.load(open(args.out))
        print(markdown(saved["results"], summarize(saved["results"])))
        return
    names = [n for n in args.only.split(",") if n] or model_types()
    unknown = sorted(set(names) - set(model_types()))
    if unknown:
        parser.error(f"not causal-LM model types of this transformers: {unknown}")
    if args.eager_only:
        rows = eager_only(names)
        built = [r for r in rows if r["build"] == "ok"]
        print(f"{len(built)} of {len(rows)} build, {sum(r.get('eager') == 'ok' for r in built)} run eagerly", file=sys.stderr)
        return

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    start = time.perf_counter()
    done: dict[str, dict] = {}
    if args.resume and os.path.exists(args.out):
        done = {r["model_type"]: r for r in json.load(open(args.out))["results"]}
    meta = {
        "date": datetime.date.today().isoformat(),
        "command": "python bench/arch_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__, "transformers": transformers.__version__, "timeout": args.timeout,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save():  # after every row: a sweep cut short keeps what it did (--resume goes on)
        rows = [done[n] for n in names if n in done]
        meta["seconds"] = round(time.perf_counter() - start)
        with open(args.out + ".tmp", "w") as f:
            json.dump({"meta": meta, "summary": summarize(rows), "results": rows}, f, indent=1, default=str)
        os.replace(args.out + ".tmp", args.out)

    def progress(row):
        done[row["model_type"]] = row
        save()
        what = cause(row) if row.get("eager") == "ok" else row.get("build") if row.get("build") != "ok" else row.get("eager") or row.get("timeout") or row.get("died")
        print(f"{row['model_type']:<28} {row.get('wall_seconds', 0):>6.1f}s  {(what or 'right, whole, AOT right')[:150]}", file=sys.stderr, flush=True)

    todo = [n for n in names if n not in done]
    if args.moe_first:
        todo.sort(key=lambda n: not _config_counts_experts(n))
    sweep(todo, args.timeout, max(1, args.jobs), progress)
    save()
    rows = [done[n] for n in names if n in done]
    s = summarize(rows)
    print(
        f"{s['architectures']} architectures, {s['built']} built, {s['eager_runs']} run eagerly; of those torch.compile right "
        f"{s['tc_right_pct']}%, whole {s['whole_pct']}%, AOT right {s['aot_right_pct']}%; MoE {s['moe']}: whole {s['moe_whole']}, "
        f"AOT {s['moe_aot']} ({meta['seconds']} s; wrote {args.out})"
    )
    if args.markdown:
        print()
        print(markdown(rows, s))


if __name__ == "__main__":
    main()
