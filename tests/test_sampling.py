"""The pure next-character function, on hand-made logits."""

from pathlib import Path

import pytest
import torch

import charlm
from charlm.decoding.options import DecodeOptions, OptionError
from charlm.decoding.sampling import draw, filter_top_k, filter_top_p, sample_next, sample_rows

LOGITS = torch.tensor([[1.0, 3.0, 2.0, 0.5], [0.0, -1.0, 4.0, 4.5]])


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_temperature_zero_is_greedy():
    assert sample_next(LOGITS, gen(), temperature=0).tolist() == [1, 3]


def test_top_k_one_is_greedy_whatever_the_temperature():
    for seed in range(20):
        assert sample_next(LOGITS, gen(seed), temperature=5.0, top_k=1).tolist() == [1, 3]


def test_top_k_above_the_vocabulary_keeps_everything():
    assert torch.equal(filter_top_k(LOGITS, 100), LOGITS)


def test_top_k_keeps_exactly_k():
    kept = torch.isfinite(filter_top_k(LOGITS, 2))
    assert kept.tolist() == [[False, True, True, False], [False, False, True, True]]


def test_a_tiny_top_p_keeps_exactly_one_character():
    kept = torch.isfinite(filter_top_p(LOGITS, 1e-6))
    assert kept.sum(dim=-1).tolist() == [1, 1]
    assert kept[0, 1] and kept[1, 3]
    for seed in range(20):
        assert sample_next(LOGITS, gen(seed), temperature=1.0, top_p=1e-6).tolist() == [1, 3]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(filter_top_p(logits, 0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_top_p(logits, 0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(filter_top_p(logits, 1.0)).all()


def test_same_generator_seed_gives_the_same_draws_and_others_differ():
    logits = torch.zeros(64, 10)
    a = sample_next(logits, gen(1), temperature=1.0)
    b = sample_next(logits, gen(1), temperature=1.0)
    c = sample_next(logits, gen(2), temperature=1.0)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    counts = torch.bincount(sample_next(logits, gen(0), temperature=1.0), minlength=3) / 20000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)


def test_low_temperature_sharpens():
    logits = torch.tensor([[1.0, 2.0]]).expand(5000, 2)
    hot = sample_next(logits, gen(0), temperature=2.0).float().mean()
    cold = sample_next(logits, gen(0), temperature=0.2).float().mean()
    assert cold > hot


# sample_rows: the server's running batch, every row with its own options and generator.


def rows(n, temperature=1.0, top_k=None, top_p=1.0, seed=0):
    return [gen(seed + i) for i in range(n)], [temperature] * n, [top_k] * n, [top_p] * n


def test_rows_each_follow_their_own_options():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(4, 4)
    seen: list[set] = [set() for _ in range(4)]
    for seed in range(300):
        generators = [gen(seed * 4 + i) for i in range(4)]
        ids = sample_rows(logits, generators, [0.0, 1.0, 1.0, 1.0], [None, 2, None, None], [1.0, 1.0, 0.8, 1.0])
        for row, token in enumerate(ids):
            seen[row].add(token)
    assert seen == [{0}, {0, 1}, {0, 1}, {0, 1, 2, 3}]  # greedy; top-k 2; top-p 0.8; everything


def test_a_rows_draws_depend_on_its_seed_alone():
    logits = torch.zeros(3, 50)
    generator = gen(5)
    alone = [sample_rows(logits[:1], [generator], [1.0], [None], [1.0])[0] for _ in range(20)]
    crowd_generators = [gen(9), gen(5), gen(11)]
    options = ([1.0, 1.0, 0.7], [None, None, 3], [1.0, 1.0, 0.5])
    in_a_crowd = [sample_rows(logits, crowd_generators, *options)[1] for _ in range(20)]
    assert alone == in_a_crowd and len(set(alone)) > 5


def test_row_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    ids = torch.tensor(sample_rows(logits, *rows(20000)))
    counts = torch.bincount(ids, minlength=3) / 20000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)
    hot = torch.tensor(sample_rows(logits, *rows(20000, temperature=3.0))).float().mean()
    assert hot > ids.float().mean() + 0.2  # a higher temperature flattens


def test_a_draw_is_what_torch_multinomial_draws_from_the_same_generator():
    """Texts sampled before draw() replaced torch.multinomial stay the same for the same seed."""
    ours, theirs = gen(7), gen(7)
    for i in range(500):
        logits = torch.randn(3, 65, generator=gen(i)) * 3
        if i % 5 == 0:
            logits[:, 20:] = float("-inf")  # as top-k and top-p leave them
        probs = torch.softmax(logits, dim=-1)
        want = torch.multinomial(probs, num_samples=1, generator=theirs).squeeze(-1)
        assert torch.equal(draw(probs, [ours] * 3), want)


@pytest.mark.parametrize(
    "options",
    [
        ([0.8] * 4, [5] * 4, [0.9] * 4),  # one set of options for the batch
        ([0.8, 0.0, 1.3, 0.5], [5, None, 2, 70], [0.9, 1.0, 0.5, 1.0]),  # each row its own
    ],
)
def test_a_row_in_a_batch_draws_what_sample_next_draws_for_it_alone(options):
    """The server's batched rule and the command line's are one rule: the same seed, logits and options give the same
    id, ties at the k-th logit included, step after step."""
    temperatures, top_ks, top_ps = options
    batch_generators = [gen(100 + i) for i in range(4)]
    alone_generators = [gen(100 + i) for i in range(4)]
    for step in range(200):
        logits = torch.randn(4, 65, generator=gen(step)) * 2
        logits[:, 10:14] = logits[:, 10:11]  # ties
        batched = sample_rows(logits, batch_generators, temperatures, top_ks, top_ps)
        for row in range(4):
            alone = sample_next(logits[row : row + 1], alone_generators[row], *[o[row] for o in options])
            assert batched[row] == alone.item(), (step, row)


def test_rows_sharing_a_generator_draw_as_one_batch_does():
    logits = torch.randn(3, 65, generator=gen(1))
    shared, reference = gen(4), gen(4)
    for _ in range(50):
        ids = sample_rows(logits, [shared, gen(9), shared], [1.0] * 3, [None] * 3, [1.0] * 3)
        want = sample_next(logits[[0, 2]], reference, 1.0)
        assert [ids[0], ids[2]] == want.tolist()


def test_temperatures_past_the_bound_are_refused_and_those_within_keep_top_k_and_top_p():
    """Past float32's largest number the scaled logits are 0 (NaN where -inf), and top-k and top-p keep nothing apart:
    the one check of the options refuses a temperature long before, for every way of decoding."""
    with pytest.raises(OptionError, match="--temperature must be at most 10000"):
        DecodeOptions(temperature=1e39).checked()
    assert DecodeOptions(temperature=1e4).checked().temperature == 1e4
    masked = LOGITS.clone()
    masked[:, 0] = float("-inf")  # a symbol never drawn, as a lines model's padding
    for seed in range(20):
        assert sample_next(masked, gen(seed), temperature=1e4, top_k=1).tolist() == [1, 3]
        assert sample_next(masked, gen(seed), temperature=1e4, top_p=0.0).tolist() == [1, 3]
        assert sample_rows(masked, [gen(seed)] * 2, [1e4, 1e4], [1, None], [1.0, 0.0]) == [1, 3]


def test_a_vanishing_temperature_is_greedy_not_an_overflow():
    assert sample_next(LOGITS, gen(), temperature=1e-40).tolist() == [1, 3]


def test_draws_are_the_cpus_whatever_the_default_device_and_every_generator_is_the_cpus():
    """A seed's draws are the same numbers on every device only while each decoding path makes its generator on the
    CPU and draw() its noise there: a notebook's default device (torch.set_default_device) leaves them as they were,
    one generator shared by the rows or one each."""
    probs = torch.softmax(torch.randn(4, 40, generator=torch.Generator().manual_seed(1)), dim=-1)
    for generators in ([torch.Generator().manual_seed(5)] * 4, [torch.Generator().manual_seed(s) for s in range(4)]):
        states = [g.get_state() for g in generators]
        before = draw(probs, generators)
        for g, state in zip(generators, states, strict=True):
            g.set_state(state)
        with torch.device("meta"):  # where a tensor made without a device would go
            assert torch.equal(draw(probs, generators), before)
    package = Path(charlm.__file__).parent
    on_a_device = [f"{p}:{n}" for p in package.rglob("*.py") for n, line in enumerate(p.read_text().splitlines(), 1)
                   if "Generator(device" in line]  # fmt: skip
    assert on_a_device == []
