"""Configs: the shipped files load and say their command, precedence of defaults, file, --set and options, and
one-line refusals of unknown keys, wrong types and values out of range."""

from pathlib import Path

import pytest

from charlm.config.build import load_config
from charlm.config.schema import CONFIG_DIRS, Config, shipped_config_names
from charlm.config.sources import read_yaml_file as yaml_file
from charlm.errors import UsageError

SHIPPED = sorted((CONFIG_DIRS[0]).glob("*.yaml"))


def test_the_four_required_configs_ship():
    assert {"tiny", "cpu", "notebook", "gpu"} <= set(shipped_config_names())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_starts_with_its_command(path: Path):
    config = load_config(path)
    assert isinstance(config, Config)
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# charlm train --config configs/" + path.name)


def test_gpu_config_is_the_baby_gpt_shape():
    m = load_config("gpu").model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.dropout, m.bias) == (6, 6, 384, 256, 0.2, False)
    assert load_config("gpu").train.batch_size == 64 and load_config("gpu").train.lr == 1e-3


def test_notebook_config_is_the_notebook_recipe():
    c = load_config("notebook")
    assert (c.train.batch_size, c.model.block_size, c.model.n_embd, c.model.n_head, c.model.n_layer) == (
        16,
        32,
        64,
        4,
        4,
    )
    assert (c.train.plateau_factor, c.train.plateau_patience, c.train.eval_interval) == (0.5, 5, 200)
    assert (c.train.early_stop_patience, c.train.max_steps, c.train.lr, c.model.dropout) == (10, 30000, 1e-3, 0.0)
    m, t = c.model, c.train
    assert (m.pos_encoding, m.norm, m.norm_position, m.activation, m.ffn_mult) == (
        "learned",
        "layernorm",
        "pre",
        "relu",
        4,
    )
    assert (m.bias, m.qkv_bias, m.tie_weights, m.head_bias, m.init) == (True, False, False, True, "torch")
    assert (t.beta1, t.beta2, t.weight_decay, t.decay, t.grad_clip, t.warmup_steps) == (0.9, 0.999, 0.01, "all", 0, 0)
    assert (t.lr_schedule, t.min_lr, t.eval_at_start, t.eval_sampling, t.eval_windows, t.seed) == (
        "plateau",
        0,
        True,
        "random",
        3200,
        1337,
    )
    assert c.sample.temperature == 1.0 and c.data.val_fraction == 0.1


def test_notebook_model_has_the_notebooks_parameter_count_and_torch_initialisation():
    import torch

    from charlm.models.decoder import Decoder

    c = load_config("notebook")
    torch.manual_seed(0)
    model = Decoder(c.model, 65)
    assert model.num_params() == 209_729  # what torch counts for the notebook's own model
    # torch's defaults, not GPT-2's: embeddings N(0, 1), Linear weights uniform within 1/sqrt(fan_in), biases too
    assert 0.9 < float(model.tok_emb.weight.detach().std()) < 1.1
    bound = 1 / 64**0.5
    assert float(model.head.weight.detach().abs().max()) <= bound and float(model.head.bias.detach().abs().max()) > 0


@pytest.mark.parametrize("base", ["", "base: defaults\n"])
def test_precedence_is_defaults_then_file_then_set_then_options(tmp_path, base):
    f = tmp_path / "c.yaml"
    f.write_text(base + "model:\n  n_layer: 5\n  n_embd: 96\ntrain:\n  lr: 0.01\n  seed: 5\n")
    c = load_config(f, ["train.lr=2e-3", "train.seed=6"], {"train.seed": ("--seed", 7)})
    assert c.model.n_layer == 5  # file over what it builds on
    under = Config() if base else load_config("cpu")  # the built-in defaults, or the default recipe by default
    assert c.model.n_head == under.model.n_head and c.train.optimizer == under.train.optimizer  # kept
    assert c.train.lr == 2e-3  # --set over file
    assert c.train.seed == 7  # option over --set


def test_ints_are_accepted_where_floats_are_expected(tmp_path):
    c = load_config(None, ["train.lr=1", "train.max_seconds=30"])
    assert c.train.lr == 1.0 and isinstance(c.train.lr, float)


def _errors(*sets: str, path=None) -> list[str]:
    with pytest.raises(UsageError) as info:
        load_config(path, list(sets))
    return info.value.details or [str(info.value)]


def test_unknown_key_suggests_the_close_one():
    (message,) = _errors("model.n_layers=3")
    assert "model.n_layers" in message and "did you mean 'model.n_layer'" in message


def test_wrong_type_names_the_key():
    (message,) = _errors("model.n_embd=wide")
    assert message.startswith("model.n_embd:") and "integer" in message


def test_bool_is_not_an_int():
    (message,) = _errors("train.batch_size=true")
    assert "train.batch_size" in message


@pytest.mark.parametrize(
    "setting,key",
    [
        ("train.lr=0", "train.lr"),
        ("train.lr=-1e-3", "train.lr"),
        ("model.block_size=0", "model.block_size"),
        ("model.dropout=1.0", "model.dropout"),
        ("model.dropout=-0.1", "model.dropout"),
        ("data.val_fraction=0", "data.val_fraction"),
        ("data.val_fraction=1", "data.val_fraction"),
        ("sample.top_p=1.5", "sample.top_p"),
        ("sample.temperature=2e4", "sample.temperature"),  # past 1e4 a draw is uniform; past 3.4e38 it breaks
        ("train.device=tpu", "train.device"),
    ],
)
def test_out_of_range_values_name_the_key(setting, key):
    (message,) = _errors(setting)
    assert message.startswith(key), message


def test_zero_heads_is_an_error_not_a_crash():
    (message,) = _errors("model.n_head=0")
    assert message.startswith("model.n_head")


def test_n_embd_must_divide_by_n_head():
    (message,) = _errors("model.n_embd=100", "model.n_head=3")
    assert "model.n_embd" in message and "model.n_head" in message


def test_all_errors_are_reported_at_once(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model:\n  n_layerz: 2\ntrain:\n  lr: fast\n")
    errors = _errors("train.batch_size=0", path=f)
    assert len(errors) == 3
    assert any("model.n_layerz" in e for e in errors)
    assert any(e.startswith("train.lr") for e in errors)
    assert any(e.startswith("train.batch_size") for e in errors)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("foo: {}\n", "unknown section 'foo'"),  # empty: nothing would have been applied, so nothing was said
        ("modle:\n", "did you mean 'model'?"),
        ("n_layer: 2\n", "write 'model:' and on the next line '  n_layer: ...'"),  # a key written at the top
        ("model.n_layer: 2\n", "write 'model:' and on the next line '  n_layer: ...'"),  # as --set writes it
    ],
)
def test_a_config_files_unknown_section_is_named_with_how_to_nest_a_key(tmp_path, text, expected):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    (message,) = _errors(path=f)
    assert expected in message, message


def test_yaml_merge_keys_load_and_an_unhashable_key_is_one_line(tmp_path):
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {lr: 0.01, batch_size: 4}\ntrain:\n  <<: *b\n  lr: 0.02\n")
    assert yaml_file(merged)["train"] == {"lr": 0.02, "batch_size": 4}  # a merged key overridden is no repeat
    odd = tmp_path / "odd.yaml"
    odd.write_text("? [1]\n: 2\n")
    with pytest.raises(UsageError, match="not valid YAML at line 1"):
        yaml_file(odd)


def test_yaml_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    f = tmp_path / "evil.yaml"
    f.write_text(f"train: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(f)
    assert not marker.exists()


def test_broken_yaml_reports_the_line(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("model:\n  n_layer: [2\n")
    with pytest.raises(UsageError, match="line"):
        load_config(f)


def test_set_needs_a_dotted_key_and_a_value():
    with pytest.raises(UsageError, match="section.key=value"):
        load_config(None, ["lr=3"])


def test_missing_config_file_lists_the_shipped_ones():
    with pytest.raises(UsageError, match="tiny"):
        load_config("no-such-config.yaml")


def test_docs_config_md_is_current():
    from conftest import REPO

    from charlm.config.reference import reference_markdown

    assert (REPO / "docs" / "config.md").read_text() == reference_markdown(), "run python scripts/gen_config_docs.py"


def test_every_lr_schedule_has_its_words_in_the_docs():
    import typing

    from charlm.config import reference as config_docs
    from charlm.config.schema import TrainConfig

    values = typing.get_args(typing.get_type_hints(TrainConfig)["lr_schedule"])
    assert set(config_docs.SCHEDULE_WORDS) == set(values)  # a value without words would still document (.get)


def test_the_g2p_recipes_hold_out_the_same_words():
    """configs/g2p-hour.yaml is scored beside configs/g2p.yaml: the same file and sizes (the split's seed is fixed),
    and the same context, which decides the over-long lines that are left out."""
    short, hour = load_config("g2p"), load_config("g2p-hour")
    assert short.data == hour.data and short.model.block_size == hour.model.block_size


def test_a_checkpoints_temperature_from_before_its_bound_loads_at_the_bound():
    """sample.temperature had no upper bound before 1e4: a config saved with more still loads (uniform either way)."""
    from charlm.config.build import config_from_dict

    assert config_from_dict({"sample": {"temperature": 2e4}}, "a checkpoint").sample.temperature == 1e4
