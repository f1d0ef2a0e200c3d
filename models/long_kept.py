"""What the long prompts of a process keep, within one budget: the least recently used gives its layers up."""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Protocol


class Keeping(Protocol):
    """What the budget reads of a long prompt (``long.LongAttention``): its id, the bytes its layers keep, and how
    it gives them up (the bytes freed)."""

    uid: int

    @property
    def nbytes(self) -> int: ...

    def release(self) -> int: ...

KEPT_BYTES = 384 * 2**20  # what the long prompts of a process keep together: two of SmolLM2's 4,096 tokens, run up


class Kept:
    """The long prompts of a process and what they keep (the streams and attention inputs of their layers), within
    ``budget`` bytes together. A prompt that keeps a layer past the budget takes the kept layers of the other
    prompts, the least recently used first, which run again from their first layer when next asked; a prompt
    running a layer at that moment is passed over. A prompt is used when a layer of it is asked for (``touch``),
    not when the server runs it ahead of the sessions, which it does only while the budget has room."""

    def __init__(self, budget: int = KEPT_BYTES):
        self.budget = budget
        self._used: OrderedDict[int, weakref.ref] = OrderedDict()  # uid -> prompt, least recently used first
        self._lock = threading.Lock()
        self.released = 0  # how many times a prompt gave up its layers

    def touch(self, prompt: Keeping) -> None:
        with self._lock:
            self._used[prompt.uid] = weakref.ref(prompt)
            self._used.move_to_end(prompt.uid)

    def prompts(self) -> list[Keeping]:
        """The prompts alive, the least recently used first."""
        with self._lock:
            for uid in [uid for uid, ref in self._used.items() if ref() is None]:
                del self._used[uid]
            return [p for p in (ref() for ref in self._used.values()) if p is not None]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.prompts())

    def has_room(self, more: int) -> bool:
        """Whether ``more`` bytes fit within the budget beside what every prompt keeps."""
        return self.nbytes + more <= self.budget

    def fit(self, prompt: Keeping) -> None:
        """Once ``prompt`` has kept a layer: release the other prompts' layers, the least recently used first,
        while all of them together keep more than the budget."""
        prompts = self.prompts()
        total = sum(p.nbytes for p in prompts)
        for other in prompts:
            if total <= self.budget:
                return
            if other is not prompt:
                freed = other.release()
                self.released += bool(freed)
                total -= freed


KEPT = Kept()
