"""Checkpoints written by an earlier charlm load and decode exactly as they did then.

tests/data/before/ holds tiny models of every family and the options that change a model's code path (positional
encodings, token shift, pre/post norm, tied/untied heads, biases, a mixture of experts, explicit attention), written
in charlm's checkpoint format before the families were rebuilt on one shared core, with their weights moved off
their initial values by seeded noise. Beside each model's weights the file holds what that code computed: the logits
of fixed inputs, a greedy continuation (decoder: charlm.decoding.generate; encoder-decoder: transduce; encoder: the
top character at every position), and the steps of the cached decoding loop fed a fixed text (encoder: the attention
maps). The model rebuilt from the file by today's code must give the same figures, to float32's rounding
across CPUs (5e-5 plus 1e-5 of the value), and the same choices.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO

from charlm.decoding.generate import generate_ids
from charlm.decoding.options import DecodeOptions
from charlm.decoding.rewrite import rewrite
from charlm.decoding.steps import ModuleTargetSteps
from charlm.families.registry import build_model
from charlm.storage.checkpoint import load_checkpoint

BEFORE = REPO / "tests" / "data" / "before"
FILES = sorted(BEFORE.glob("*.pt"))


def same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # The figures were computed on an AMD EPYC; an Intel Xeon's float32 kernels sum in another order and differ by up
    # to ~1.2e-5 on these logits. A changed code path moves them by orders of magnitude more.
    torch.testing.assert_close(actual, expected, atol=5e-5, rtol=1e-5)


def test_every_family_has_stored_models():
    names = {p.stem.split("_")[0] for p in FILES}
    assert names == {"decoder", "encdec", "encoder"}, names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
@torch.no_grad()
def test_a_model_written_before_gives_the_same_logits_and_choices(path: Path):
    checkpoint = load_checkpoint(path)
    model = checkpoint.build_model().eval()
    stored = checkpoint.state
    inputs, arch = stored["inputs"], checkpoint.config.model.arch
    if arch == "decoder":
        same(model(inputs["idx"])[0], stored["expected_logits"])
        steps = generate_ids(model, inputs["prompt"].tolist(), 30, 1, lambda logits: logits.argmax(-1))
        assert [int(ids[0]) for ids in steps] == stored["expected_greedy"].tolist()
        same(forced_steps(model, inputs["text"]), stored["expected_steps"])
    elif arch == "encoder-decoder":
        same(model(inputs["src"], inputs["tgt_in"])[0], stored["expected_logits"])
        sources = [[i for i in row if i >= 0] for row in inputs["sources"].tolist()]
        outputs = rewrite(model, sources, DecodeOptions(max_new_tokens=30, temperature=0.0, batch_size=8))
        assert outputs == [[i for i in row if i >= 0] for row in stored["expected_greedy"].tolist()]
        target = ModuleTargetSteps(model, sources)  # the cached target side fed the stored targets
        tgt_in = inputs["tgt_in"]
        same(
            torch.stack([target.logits(tgt_in[:, i : i + 1]) for i in range(tgt_in.size(1))], 1),
            stored["expected_steps"],
        )
    else:
        logits = model(inputs["idx"])[0]
        same(logits, stored["expected_logits"])
        assert torch.equal(logits[..., : model.vocab_size].argmax(-1), stored["expected_greedy"])
        same(model.attention_weights(inputs["idx"][:1, :8]), stored["expected_steps"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_fresh_model_starts_from_the_same_weights_as_before(path: Path):
    """Same seed, same initial weights, under the same names in the same order: the modules are made, and their
    weights drawn, in the order they were (an optimizer's saved state follows that order too)."""
    checkpoint = load_checkpoint(path)
    torch.manual_seed(checkpoint.state["seed"])
    fresh = build_model(checkpoint.config.model, checkpoint.tokenizer.vocab_size).state_dict()
    assert list(fresh) == list(checkpoint.state["model"])
    place = [torch.linspace(1, 2, t.numel(), dtype=torch.float64) for t in fresh.values()]
    sums = torch.stack([(t.double().flatten() * w).sum() for t, w in zip(fresh.values(), place, strict=True)])
    torch.testing.assert_close(sums, checkpoint.state["fresh_sums"], atol=0, rtol=1e-12)


@pytest.mark.parametrize("folder", sorted((BEFORE / "exports").iterdir()), ids=lambda p: p.name)
@torch.no_grad()
def test_an_export_written_before_loads_and_gives_the_same_logits(folder: Path):
    """Export folders (safetensors, config.json, vocab.json) written by `charlm export` of the code before the
    packages by role, from three of the models above: today's charlm.load reads them and computes what that code
    stored beside the model."""
    pytest.importorskip("safetensors", reason="exports need the safetensors package (the test extra has it)")
    import charlm

    stored = load_checkpoint(BEFORE / f"{folder.name}.pt").state
    model = charlm.load(folder, "cpu").module.eval()
    inputs = stored["inputs"]
    logits = model(inputs["src"], inputs["tgt_in"])[0] if "src" in inputs else model(inputs["idx"])[0]
    same(logits, stored["expected_logits"])


def forced_steps(model: torch.nn.Module, text: torch.Tensor) -> torch.Tensor:
    """The logits (N - 1, V) of every step of the cached decoding loop fed the text's own next character."""
    seen: list[torch.Tensor] = []

    def teacher(logits: torch.Tensor) -> torch.Tensor:
        seen.append(logits[0].clone())
        return text[len(seen) : len(seen) + 1]

    for _ in generate_ids(model, text[:1].tolist(), len(text) - 1, 1, teacher):
        pass
    return torch.stack(seen)
