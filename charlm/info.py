"""Parameter counts per component and training FLOPs per token, each beside its closed-form formula."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from charlm.config import ModelConfig
from charlm.layers import ffn_hidden, part_bias


@dataclass
class Row:
    component: str
    params: int
    formula: str
    per_layer: bool = False  # counted once per layer (the total multiplies it by n_layer)


@dataclass
class ModelInfo:
    rows: list[Row]
    n_layer: int
    total_params: int
    flops_per_token: int
    flops_formula: str
    active_params: int = 0  # parameters a token uses (fewer than total with a mixture of experts)

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


def model_info(config: ModelConfig, vocab_size: int) -> ModelInfo:
    d, L, V, T = config.n_embd, config.n_layer, vocab_size, config.block_size
    h = ffn_hidden(config)
    norm, norm_f = _norm(config)
    rows = [Row("token embedding", V * d, "V·d")]
    if config.pos_encoding == "learned":
        rows.append(Row("positional embedding (learned)", T * d, "block_size·d"))
    else:
        rows.append(Row(f"positional encoding ({config.pos_encoding})", 0, "no parameters"))

    qkv_b, proj_b, fb = (int(part_bias(config, part)) for part in ("qkv", "proj", "ffn"))
    attn = 4 * d * d + qkv_b * 3 * d + proj_b * d
    attn_f = "4·d²" + {4: " + 4·d", 3: " + 3·d", 1: " + d", 0: ""}[3 * qkv_b + proj_b]
    rows.append(Row("attention Q/K/V/output", attn, attn_f, per_layer=True))
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
        rows.append(Row(f"router ({E} experts)", d * E, "d·E", per_layer=True))
        rows.append(
            Row(
                f"feed-forward experts ({config.activation}, d_ff = {h}, top-{k} of {E})",
                E * ffn,
                f"E·({ffn_f})",
                per_layer=True,
            )
        )
    else:
        rows.append(Row(f"feed-forward ({config.activation}, d_ff = {h})", ffn, ffn_f, per_layer=True))
    rows.append(Row(f"norms ({config.norm}, {config.norm_position})", 2 * norm, f"2·{norm_f}", per_layer=True))
    if config.norm_position == "pre":
        rows.append(Row("final norm", norm, norm_f))
    hb = V if config.head_bias else 0
    if config.tie_weights:
        rows.append(Row("output head (tied to the token embedding)", hb, "shares V·d" + (", + V bias" if hb else "")))
    else:
        rows.append(Row("output head", d * V + hb, "d·V + V" if hb else "d·V"))

    if extras:  # options without parameters: named so that the table shows the whole recipe
        rows.append(Row(", ".join(extras), 0, "no parameters"))
    total = sum(r.params * (L if r.per_layer else 1) for r in rows)
    active = total - L * (E - k) * ffn if E else total  # per token, only k experts' weights are used
    # Matmul weights a token uses: embedding lookups cost no FLOPs, the head does (tied or not).
    n_matmul = L * (attn + (k * ffn + d * E if E else ffn)) + d * V
    flops = 6 * n_matmul + 12 * L * d * T
    formula = "6·N + 12·L·d·T"  # N: matmul weights, L·(attention + feed-forward) + d·V; T = block_size
    return ModelInfo(rows, L, total, flops, formula, active)
