"""Parameter counts per component and training FLOPs per token, each beside its closed-form formula."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from charlm.config.schema import ModelConfig
from charlm.models.layers import ffn_hidden, part_bias


@dataclass
class ComponentRow:
    component: str
    params: int
    formula: str
    per_layer: bool = False  # counted once per layer (the total multiplies it by its stack's layers)
    stack: str = "layer"  # which layers: "layer" (a decoder-only model's), "encoder" or "decoder"


@dataclass
class ModelInfo:
    rows: list[ComponentRow]
    n_layer: int
    total_params: int
    flops_per_token: int
    flops_formula: str
    active_params: int = 0  # parameters a token uses (fewer than total with a mixture of experts)
    stacks: dict[str, int] | None = None  # layers of each stack: {"layer": n_layer}, or encoder and decoder

    def to_dict(self) -> dict:
        return {
            "total_params": self.total_params,
            "active_params": self.active_params,
            "flops_per_token": self.flops_per_token,
            "flops_formula": self.flops_formula,
            "components": [asdict(r) for r in self.rows],
        }


def _norm(config: ModelConfig) -> tuple[int, str]:
    d = config.n_embd
    if config.norm == "rmsnorm":
        return d, "d"
    return (2 * d, "2·d") if config.bias else (d, "d")


def _attention(config: ModelConfig) -> tuple[int, str]:
    d = config.n_embd
    qkv_b, proj_b = (int(part_bias(config, part)) for part in ("qkv", "proj"))
    return 4 * d * d + qkv_b * 3 * d + proj_b * d, "4·d²" + {4: " + 4·d", 3: " + 3·d", 1: " + d", 0: ""}[
        3 * qkv_b + proj_b
    ]


def _feed_forward(config: ModelConfig) -> tuple[int, str, str]:
    d, h, fb = config.n_embd, ffn_hidden(config), int(part_bias(config, "ffn"))
    name = f"feed-forward ({config.activation}, d_ff = {h})"
    if config.activation == "swiglu":
        return 3 * d * h + fb * (2 * h + d), "3·d·d_ff + 2·d_ff + d" if fb else "3·d·d_ff", name
    return 2 * d * h + fb * (h + d), "2·d·d_ff + d_ff + d" if fb else "2·d·d_ff", name


def _head(config: ModelConfig, V: int) -> ComponentRow:
    d, hb = config.n_embd, V if config.head_bias else 0
    if config.tie_weights:
        return ComponentRow(
            "output head (tied to the token embedding)", hb, "shares V·d" + (", + V bias" if hb else "")
        )
    return ComponentRow("output head", d * V + hb, "d·V + V" if hb else "d·V")


def _token_shift(config: ModelConfig, stacks: tuple[str, ...] = ("layer",)) -> list[ComponentRow]:
    """model.token_shift's mix and gate vectors: at the embeddings (each side's, for an encoder-decoder) and at each
    layer's self-attention input."""
    if not config.token_shift:
        return []
    d, sides = config.n_embd, len(stacks)
    embeddings = "token shift, embeddings (mix and gate" + (", each side)" if sides == 2 else ")")
    rows = [ComponentRow(embeddings, 2 * sides * d, f"{2 * sides}·d")]
    return rows + [
        ComponentRow("token shift, attention input (mix and gate)", 2 * d, "2·d", True, stack) for stack in stacks
    ]


def encoder_decoder_info(config: ModelConfig, vocab_size: int) -> ModelInfo:
    """The encoder's and the decoder's rows apart, cross-attention its own row; as nn.Transformer counts them."""
    d, V, T, Ld = config.n_embd, vocab_size, config.block_size, config.n_layer
    Le = config.n_encoder_layer or Ld
    norm, norm_f = _norm(config)
    attn, attn_f = _attention(config)
    ffn, ffn_f, ffn_name = _feed_forward(config)
    shared = config.share_embeddings
    rows = [
        ComponentRow("token embedding" + (" (sources and targets share it)" if shared else " (targets)"), V * d, "V·d")
    ]
    if not shared:
        rows.append(ComponentRow("source embedding", V * d, "V·d"))
    if config.pos_encoding == "learned":
        rows.append(ComponentRow("positional embeddings (learned; encoder and decoder)", 2 * T * d, "2·block_size·d"))
    else:
        rows.append(ComponentRow(f"positional encoding ({config.pos_encoding})", 0, "no parameters"))
    rows += _token_shift(config, ("encoder", "decoder"))
    rows += [
        ComponentRow("self-attention Q/K/V/output (both ways, padding masked)", attn, attn_f, True, "encoder"),
        ComponentRow(ffn_name, ffn, ffn_f, True, "encoder"),
        ComponentRow(f"norms ({config.norm}, {config.norm_position})", 2 * norm, f"2·{norm_f}", True, "encoder"),
        ComponentRow("self-attention Q/K/V/output (causal)", attn, attn_f, True, "decoder"),
    ]
    n_norms = 3 if config.cross_attention else 2
    if config.cross_attention:
        rows.append(ComponentRow("cross-attention Q (decoder), K/V (encoder), output", attn, attn_f, True, "decoder"))
    rows.append(ComponentRow(ffn_name, ffn, ffn_f, True, "decoder"))
    rows.append(
        ComponentRow(
            f"norms ({config.norm}, {config.norm_position})", n_norms * norm, f"{n_norms}·{norm_f}", True, "decoder"
        )
    )
    if config.norm_position == "pre":
        rows.append(ComponentRow("final norms (encoder's output, decoder's)", 2 * norm, f"2·{norm_f}"))
    rows.append(_head(config, V))
    stacks = {"encoder": Le, "decoder": Ld}
    total = sum(r.params * (stacks[r.stack] if r.per_layer else 1) for r in rows)
    cross = attn if config.cross_attention else 0
    n_matmul = Le * (attn + ffn) + Ld * (attn + cross + ffn) + d * V
    flops = 6 * n_matmul + 12 * (Le + 2 * Ld) * d * T
    formula = "6·N + 12·(Le + 2·Ld)·d·T"  # N: matmul weights; the decoder attends twice (itself, the encoder)
    return ModelInfo(rows, Ld, total, flops, formula, total, stacks)


def encoder_info(config: ModelConfig, vocab_size: int) -> ModelInfo:
    """An encoder: the decoder-only rows, over V + 1 symbols (the mask symbol), attention both ways."""
    d, L, T = config.n_embd, config.n_layer, config.block_size
    V = vocab_size + 1
    norm, norm_f = _norm(config)
    attn, attn_f = _attention(config)
    ffn, ffn_f, ffn_name = _feed_forward(config)
    rows = [ComponentRow("token embedding (+ the mask symbol)", V * d, "(V + 1)·d")]
    if config.pos_encoding == "learned":
        rows.append(ComponentRow("positional embedding (learned)", T * d, "block_size·d"))
    else:
        rows.append(ComponentRow(f"positional encoding ({config.pos_encoding})", 0, "no parameters"))
    rows += _token_shift(config)
    rows += [
        ComponentRow("self-attention Q/K/V/output (both ways)", attn, attn_f, True),
        ComponentRow(ffn_name, ffn, ffn_f, True),
        ComponentRow(f"norms ({config.norm}, {config.norm_position})", 2 * norm, f"2·{norm_f}", True),
    ]
    if config.norm_position == "pre":
        rows.append(ComponentRow("final norm", norm, norm_f))
    head = _head(config, V)
    head.formula = head.formula.replace("V", "(V + 1)")
    rows.append(head)
    total = sum(r.params * (L if r.per_layer else 1) for r in rows)
    flops = 6 * (L * (attn + ffn) + d * V) + 12 * L * d * T
    return ModelInfo(rows, L, total, flops, "6·N + 12·L·d·T", total, {"layer": L})


def decoder_info(config: ModelConfig, vocab_size: int) -> ModelInfo:
    d, L, V, T = config.n_embd, config.n_layer, vocab_size, config.block_size
    h = ffn_hidden(config)
    norm, norm_f = _norm(config)
    rows = [ComponentRow("token embedding", V * d, "V·d")]
    if config.pos_encoding == "learned":
        rows.append(ComponentRow("positional embedding (learned)", T * d, "block_size·d"))
    else:
        rows.append(ComponentRow(f"positional encoding ({config.pos_encoding})", 0, "no parameters"))
    rows += _token_shift(config)

    qkv_b, proj_b, fb = (int(part_bias(config, part)) for part in ("qkv", "proj", "ffn"))
    attn = 4 * d * d + qkv_b * 3 * d + proj_b * d
    attn_f = "4·d²" + {4: " + 4·d", 3: " + 3·d", 1: " + d", 0: ""}[3 * qkv_b + proj_b]
    rows.append(ComponentRow("attention Q/K/V/output", attn, attn_f, per_layer=True))
    if config.activation == "swiglu":
        ffn, ffn_f = 3 * d * h + fb * (2 * h + d), "3·d·d_ff + 2·d_ff + d" if fb else "3·d·d_ff"
    else:
        ffn, ffn_f = 2 * d * h + fb * (h + d), "2·d·d_ff + d_ff + d" if fb else "2·d·d_ff"
    extras = [
        name
        for name, on in (
            ("QK-norm", config.qk_norm),
            ("zero-init projections", config.zero_init_proj),
            (f"logit soft-cap {config.logit_softcap:g}", config.logit_softcap),
        )
        if on
    ]
    E, k = config.n_experts, config.expert_top_k
    if E:
        rows.append(ComponentRow(f"router ({E} experts)", d * E, "d·E", per_layer=True))
        rows.append(
            ComponentRow(
                f"feed-forward experts ({config.activation}, d_ff = {h}, top-{k} of {E})",
                E * ffn,
                f"E·({ffn_f})",
                per_layer=True,
            )
        )
    else:
        rows.append(ComponentRow(f"feed-forward ({config.activation}, d_ff = {h})", ffn, ffn_f, per_layer=True))
    rows.append(ComponentRow(f"norms ({config.norm}, {config.norm_position})", 2 * norm, f"2·{norm_f}", per_layer=True))
    if config.norm_position == "pre":
        rows.append(ComponentRow("final norm", norm, norm_f))
    hb = V if config.head_bias else 0
    if config.tie_weights:
        rows.append(
            ComponentRow("output head (tied to the token embedding)", hb, "shares V·d" + (", + V bias" if hb else ""))
        )
    else:
        rows.append(ComponentRow("output head", d * V + hb, "d·V + V" if hb else "d·V"))

    if extras:  # options without parameters: named so that the table shows the whole recipe
        rows.append(ComponentRow(", ".join(extras), 0, "no parameters"))
    total = sum(r.params * (L if r.per_layer else 1) for r in rows)
    active = total - L * (E - k) * ffn if E else total  # per token, only k experts' weights are used
    # Matmul weights a token uses: embedding lookups cost no FLOPs, the head does (tied or not).
    n_matmul = L * (attn + (k * ffn + d * E if E else ffn)) + d * V
    flops = 6 * n_matmul + 12 * L * d * T
    formula = "6·N + 12·L·d·T"  # N: matmul weights, L·(attention + feed-forward) + d·V; T = block_size
    return ModelInfo(rows, L, total, flops, formula, active, {"layer": L})
