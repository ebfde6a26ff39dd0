"""train.optimizer: Muon for the blocks' matrices and AdamW for the rest; trains, resumes exactly, keeps old states."""

import json

import pytest
import torch
from conftest import run_cli, train_cli

from charlm.config.build import load_config
from charlm.models.decoder import Decoder
from charlm.storage.checkpoint import load_checkpoint
from charlm.training.optim import make_optimizer

MUON = "train.optimizer=muon"


def test_muon_chooses_its_parameters_by_role_not_by_name():
    from torch import nn

    from charlm.models.layers import MixtureOfExperts
    from charlm.training.optim import hidden_matrices

    config = load_config("tiny", ["train.optimizer=muon", "model.n_experts=2", "model.expert_top_k=1"])
    model = Decoder(config.model, 10)
    routers = [m.router.weight for m in model.modules() if isinstance(m, MixtureOfExperts)]
    expected = [m.weight for b in model.blocks for m in b.modules() if isinstance(m, nn.Linear)]
    chosen = hidden_matrices(model)
    assert {id(p) for p in chosen} == {id(p) for p in expected} - {id(p) for p in routers}
    assert routers and not {id(p) for p in routers} & {id(p) for p in chosen}  # the router is a classifier: AdamW
    assert id(model.tok_emb.weight) not in {id(p) for p in chosen}
    wrapped = nn.Sequential()  # a wrapper renames every parameter ("module.blocks..."): the choice stays the same
    wrapped.module = model
    assert [id(p) for p in hidden_matrices(wrapped)] == [id(p) for p in chosen]


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    config = load_config(
        "tiny", ["train.optimizer=muon", "model.tie_weights=false", "train.embed_lr=0.01", "train.head_lr=0.002"]
    )
    model = Decoder(config.model, 10)
    opt = make_optimizer(model, config.train, torch.device("cpu"))
    muon, adamw = opt.optimizers
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    lrs = {names[id(p)]: g["lr_scale"] * config.train.lr for g in adamw.param_groups for p in g["params"]}
    assert lrs["tok_emb.weight"] == pytest.approx(0.01) and lrs["head.weight"] == pytest.approx(0.002)
    assert lrs["ln_f.weight"] == pytest.approx(config.train.lr)
    opt.set_lr(config.train.lr / 2)  # the schedule halves every group's lr together
    assert muon.param_groups[0]["lr"] == pytest.approx(config.train.muon_lr / 2)


def test_a_tiny_model_trains_with_muon(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", steps=60, json=True, sets=[MUON]), check=True)
    losses = [m["val_loss"] for m in _metrics(tmp_path / "r")]
    assert losses[-1] < losses[0] - 0.3 and json.loads(result.stdout)["full_val_loss"] < 3.0


def test_muon_resume_is_exact(tmp_path, corpus):
    common = train_cli(corpus, quiet=True, sets=[MUON, "train.eval_interval=1"])
    run_cli(*common, "--out-dir", tmp_path / "straight", "--max-steps", "12", check=True)
    run_cli(*common, "--out-dir", tmp_path / "split", "--max-steps", "6", check=True)
    run_cli(*common, "--out-dir", tmp_path / "split", "--max-steps", "12", "--resume", check=True)
    straight, split = _metrics(tmp_path / "straight"), _metrics(tmp_path / "split")
    assert [m["step_loss"] for m in straight] == [m["step_loss"] for m in split]
    a = load_checkpoint(tmp_path / "straight" / "last.pt").state["model"]
    b = load_checkpoint(tmp_path / "split" / "last.pt").state["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_adamw_state_from_before_train_optimizer_still_loads():
    config = load_config("tiny")
    model = Decoder(config.model, 10)
    old = torch.optim.AdamW(
        [
            {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ]
    )
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    old.step()
    new = make_optimizer(model, config.train, torch.device("cpu"))
    new.load_state_dict(old.state_dict())
    assert all(g["lr_scale"] == 1.0 for g in new.param_groups) and len(new.optimizers[0].state) > 0


def test_switching_optimizer_on_resume_is_refused(tmp_path, corpus):
    run_cli(*train_cli(corpus, tmp_path / "r", steps=5), check=True)
    result = run_cli(*train_cli(out=tmp_path / "r", resume=True, sets=[MUON]))
    assert result.returncode == 2 and "train.optimizer" in result.stderr and "'adamw'" in result.stderr


@pytest.mark.parametrize("rule", ["original", "match_rms_adamw"])
def test_batched_muon_steps_as_torch_muon_does_and_shares_its_state(rule):
    """Batching the Newton-Schulz iterations over same-shaped matrices changes only bfloat16 rounding; the state
    dict is torch.optim.Muon's, so checkpoints move between the two."""
    from charlm.training.optim import BatchedMuon

    torch.manual_seed(0)
    shapes = [(24, 8), (24, 8), (8, 8), (8, 24), (24, 8)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    starts = [p.detach().clone() for p in ours]
    settings = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9, "adjust_lr_fn": rule}
    batched, reference = BatchedMuon(ours, **settings), torch.optim.Muon(theirs, **settings)
    for step in range(4):
        grads = [torch.randn(s, generator=torch.Generator().manual_seed(10 * step + i)) for i, s in enumerate(shapes)]
        for params, optimizer in ((ours, batched), (theirs, reference)):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
    for a, b, start in zip(ours, theirs, starts, strict=True):
        assert torch.allclose(a, b, atol=2e-3, rtol=1e-2)
        assert (a - start).abs().max() > 0.02  # it moved by far more than the tolerance above
    assert reference.state_dict()["state"].keys() == batched.state_dict()["state"].keys()
    BatchedMuon(theirs, **settings).load_state_dict(reference.state_dict())
    torch.optim.Muon(ours, **settings).load_state_dict(batched.state_dict())
