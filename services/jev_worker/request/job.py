"""A request as the pipeline answers it, whatever its form (envelope.py, legacy.py, a family's own form)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageSlot:
    key: str  # sha256 of the image bytes: the preencoder's asset name


@dataclass(frozen=True)
class Job:
    """One request, whatever its form: what the pipeline needs to answer it."""

    questions: dict  # question id -> question (System One types, or the form's own kinds)
    state: object  # the state as sent (span candidates are located in it)
    pieces: tuple  # the rendered state: text pieces and ImageSlots, in prompt order
    where: str  # where the state's text is in the request (error messages)
    route_text: str  # the rendered state as sent, for the route key (jev_common.route_key)
    route_images: tuple[str, ...]  # its image keys, for the route key
    l1_key: str  # identifies the prompt (the request minus id and deadline)
    extra_kinds: dict = field(default_factory=dict)  # question kinds the form asks beyond the readout's
    request: object = None  # the parsed request, for strategies that translate it whole
    coherence: str = "off"  # the request's x_coherence (questions/plan.py)
    has_images: bool = False

    @property
    def image_keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.pieces if isinstance(p, ImageSlot))

    @property
    def images(self) -> bool:
        return self.has_images or bool(self.image_keys)
