"""How many of an engine's slots are kept free of batch for chat: one rule, read by the
gateway's slot line and by the law's own slot cut, so the two draw the same line."""

from __future__ import annotations

# At most an eighth of the slots: 4 is a rounding error on a 256-slot vLLM and all of a
# 4-slot llama.cpp server.
SLOTS_KEPT_FOR_CHAT = 4


def slots_kept(engine_slots: int, most: int = SLOTS_KEPT_FOR_CHAT) -> int:
    """The slots a line keeps free for chat: an eighth of them, at least one and at most
    `most`. An eighth alone kept none under 8 slots (a 4-slot llama.cpp server let batch
    take all four), and four would be half of an 8-slot one. None on a one-slot engine,
    where keeping its slot would shut batch out, and none where `most` is 0 or less."""
    if engine_slots < 2 or most <= 0:
        return 0
    return min(most, max(1, engine_slots // 8))
