"""charlm serve's engine: texts of different lengths decoded together in one RowCache batch must give exactly what
each gives alone through generate.py's loop (greedy), for every positional encoding and across the context edge."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import with_token_shift_weights

from charlm.config.schema import ModelConfig
from charlm.data.tokenizer import CharTokenizer
from charlm.decoding.generate import generate_ids
from charlm.decoding.options import DecodeOptions
from charlm.models.decoder import Decoder
from charlm.serving.engine import Completion, Engine, QueueFull

BLOCK = 16
VOCAB = [chr(ord("a") + i) for i in range(26)] + list(" .,;:!?\n'-ABCDEF")[:14]


def model(pos_encoding: str, seed: int = 0, token_shift: bool = False) -> Decoder:
    torch.manual_seed(seed)
    shape = dict(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, dropout=0.0)
    config = ModelConfig(**shape, pos_encoding=pos_encoding, token_shift=token_shift)
    built = Decoder(config, len(VOCAB)).eval()
    return with_token_shift_weights(built) if token_shift else built


def alone(m: Decoder, prompt: list[int], n: int) -> list[int]:
    steps = generate_ids(m, prompt, n, 1, lambda logits: logits.argmax(-1))
    return torch.stack(list(steps), 1)[0].tolist()


class Collector:
    """Gathers what the engine emits for one completion, as the HTTP side would."""

    def __init__(self, tokenizer: CharTokenizer):
        self.tokenizer, self.text, self.reason, self.done = tokenizer, [], None, threading.Event()

    def __call__(self, kind: str, value) -> None:
        if kind == "text":
            self.text.append(value.text)
        else:
            self.reason = value
            self.done.set()


def completion(prompt: list[int], n: int, collector: Collector, logprobs=None, **options) -> Completion:
    settings = {"temperature": 0.0, "top_k": None, "top_p": 1.0, "stop": [], "seed": 0, **options}
    return Completion(prompt, DecodeOptions(max_new_tokens=n, **settings), logprobs, emit=collector)


@pytest.mark.parametrize(
    ("pos_encoding", "token_shift"),
    [("rope", False), ("learned", False), ("alibi", False), ("sinusoidal", False), ("rope", True), ("learned", True)],
)
def test_batched_greedy_equals_each_text_alone(pos_encoding, token_shift):
    """With token shift, each row also carries its shift points' last inputs (rows join, leave and move)."""
    m, tok = model(pos_encoding, token_shift=token_shift), CharTokenizer(VOCAB)
    rng = torch.Generator().manual_seed(1)
    lengths = [1, 5, BLOCK - 1, BLOCK, BLOCK + 7, 3 * BLOCK]
    prompts = [torch.randint(len(VOCAB), (n,), generator=rng).tolist() for n in lengths]
    news = [3, 5 * BLOCK, BLOCK, 2 * BLOCK + 3, 7, 4 * BLOCK]  # different lengths: rows leave at different steps
    engine = Engine(m, tok, max_batch=4, max_queue=16)  # fewer rows than texts: the last two wait, then join
    try:
        collectors = [Collector(tok) for _ in prompts]
        engine.submit([completion(p, n, c) for p, n, c in zip(prompts, news, collectors, strict=True)])
        for c in collectors:
            assert c.done.wait(60)
    finally:
        engine.stop()
    for prompt, n, c in zip(prompts, news, collectors, strict=True):
        assert "".join(c.text) == tok.decode(alone(m, prompt, n)), (len(prompt), n)
        assert c.reason == "length"


@torch.no_grad()
def test_row_cache_rows_keep_their_token_shift_memory_when_loaded_and_moved():
    """Each row's last input at every shift point travels with the row: loaded from the text's own cache, moved
    when a row leaves, emptied for a new text of one character; the step's logits are each text's full pass's."""
    m = model("rope", token_shift=True)
    rng = torch.Generator().manual_seed(2)
    texts = [torch.randint(len(VOCAB), (n,), generator=rng) for n in (5, 9, 13)]
    rows = m.new_row_cache(3, torch.device("cpu"))
    for row, text in enumerate(texts):
        single = m.new_cache(1, torch.device("cpu"))
        m(text[None, :-1], cache=single)
        rows.load_row(row, single)
    rows.move_row(2, 0)  # the first text leaves: the last row takes its place
    fresh = texts[1][4:5]  # the second leaves too: a new text of one character, nothing to encode, takes its row
    rows.load_row(1, None)
    rows.active = 2
    logits = m(torch.stack([texts[2][-1:], fresh]), cache=rows)[0][:, -1]  # (2, V)
    for got, text in zip(logits, (texts[2], fresh), strict=True):
        torch.testing.assert_close(got, m(text[None])[0][0, -1], rtol=1e-4, atol=1e-5)


def test_stop_string_ends_the_text_and_is_left_out():
    m, tok = model("rope"), CharTokenizer(VOCAB)
    prompt = tok.encode("the ")
    full = tok.decode(alone(m, prompt, 60))
    stop = full[20:23]  # a string the greedy text is known to contain
    engine = Engine(m, tok, max_batch=2, max_queue=4)
    try:
        c = Collector(tok)
        engine.submit([completion(prompt, 60, c, stop=[stop])])
        assert c.done.wait(30)
    finally:
        engine.stop()
    assert c.reason == "stop" and "".join(c.text) == full[: full.index(stop)]


def test_a_cancelled_completion_gives_its_row_back():
    m, tok = model("rope"), CharTokenizer(VOCAB)
    engine = Engine(m, tok, max_batch=1, max_queue=4)
    try:
        endless, quick = Collector(tok), Collector(tok)
        first = completion(tok.encode("a"), 10**6, endless)
        engine.submit([first, completion(tok.encode("b"), 5, quick)])
        first.cancelled.set()  # the client went away
        assert quick.done.wait(30) and len("".join(quick.text)) == 5
        assert not endless.done.is_set()
        assert engine.load()["running"] == 0
    finally:
        engine.stop()


def test_the_queue_limit_refuses_all_or_nothing():
    m, tok = model("rope"), CharTokenizer(VOCAB)
    engine = Engine(m, tok, max_batch=1, max_queue=2)
    try:
        hold = threading.Event()
        engine.call(hold.wait)  # keep the engine busy so nothing leaves the queue
        engine.submit([completion([0], 1, Collector(tok)) for _ in range(2)])
        with pytest.raises(QueueFull, match="--max-queue"):
            engine.submit([completion([0], 1, Collector(tok))])
        hold.set()
    finally:
        engine.stop()
