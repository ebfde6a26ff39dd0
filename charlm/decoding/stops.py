"""Stop strings, one rule wherever text is returned (OpenAI's): generated text ends just before the first stop string
complete, which is left out; text that may begin one is held back until it is known not to."""

from __future__ import annotations


class StopStrings:
    """One text's stop strings as its characters arrive: feed() says what can be passed on now."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""  # text that may be the start of a stop string
        self.stopped = False

    def feed(self, text: str) -> str:
        """What can be passed on once `text` has arrived: '' while the held text may begin a stop string; once one is
        complete, the text before it (and `stopped` is set: nothing more is to be fed)."""
        if not self.stops:
            return text
        self.held += text
        found = [at for stop in self.stops if (at := self.held.find(stop)) >= 0]
        if found:
            self.stopped = True
            passed, self.held = self.held[: min(found)], ""
            return passed
        if any(self.held.endswith(stop[:k]) for stop in self.stops for k in range(1, len(stop))):
            return ""
        passed, self.held = self.held, ""
        return passed

    def finish(self, tail: str = "") -> str:
        """What is left to pass on when generation ends: `tail` (a byte decoder's last characters) fed, then the text
        still held, which was not the start of a stop string after all ('' once one is complete)."""
        if self.stopped:
            return ""
        passed = self.feed(tail)
        if self.stopped:
            return passed
        held, self.held = self.held, ""
        return passed + held
