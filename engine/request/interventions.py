"""Interventions ("what if"): named changes to one run's forward, their text form, and their check against a config."""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..spec.errors import InputError

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

KINDS = ("engram-off", "ban-expert", "force-expert", "mhc-identity", "no-candidate-filter", "drop-stage")
# the integer fields each kind's text carries after its name, in order
FIELDS = {"engram-off": ("layer",), "ban-expert": ("layer", "expert"), "force-expert": ("layer", "expert"),
          "mhc-identity": ("layer",), "no-candidate-filter": (), "drop-stage": ("layer",)}
WHAT = {"engram-off": "switch off Engram at layer {layer}", "ban-expert": "ban expert {expert} at layer {layer}",
        "force-expert": "force expert {expert} at layer {layer}",
        "mhc-identity": "pin the mHC mixing matrices to the identity at layer {layer}",
        "no-candidate-filter": "skip the indexer's candidate filter",
        "drop-stage": "drop DSpark stage {layer}"}
SPAN = re.compile(r"([0-9]{1,9})(?:(-)([0-9]{0,9}))?", re.ASCII)
# Bounds on the text a user gives (--intervene, the app's what-if form, a link's intervene=): the longest canonical
# text is about 40 characters ('no-candidate-filter@16777215-16777216'); numbers of at most 9 digits reach past
# every layer, expert and position a config may declare (engine/spec/limits.py); a run's list stays short enough
# that checking each against the earlier ones (quadratic) is instant.
MAX_TEXT_CHARS = 64
MAX_DIGITS = 9
MAX_INTERVENTIONS = 64
EXAMPLES = "engram-off:L, ban-expert:L:E, force-expert:L:E, mhc-identity:L, no-candidate-filter, drop-stage:K"


@dataclass(frozen=True)
class Intervention:
    """One change to the forward. `layer` is the backbone layer (for drop-stage: the DSpark stage, 0-based);
    `first..last` the absolute token positions it applies at (inclusive; None = every position, last None = onwards)."""
    kind: str
    layer: int | None = None
    expert: int | None = None
    first: int | None = None
    last: int | None = None

    def __post_init__(self) -> None:
        problem = self.shape_problem()
        if problem:
            raise InputError(f"intervention {str(self.kind)[:40]!r}: {problem}")

    def shape_problem(self) -> str | None:
        """What makes the fields inconsistent for the kind (None: nothing); a config is checked separately."""
        if self.kind not in KINDS:
            return f"unknown kind; the kinds are: {', '.join(KINDS)}"
        wanted = FIELDS[self.kind]
        for name in ("layer", "expert"):
            value = getattr(self, name)
            if (value is None) == (name in wanted):
                word = self._field_word(name)
                return f"needs {'an' if word[0] == 'e' else 'a'} {word}" if value is None else f"takes no {word}"
        for name in ("layer", "expert", "first", "last"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                return f"the {self._field_word(name)} must be a whole number ≥ 0, got {value!r}"
        if self.last is not None and self.first is None:
            return f"a last position ({self.last}) needs a first position"
        if self.last is not None and self.last < self.first:
            return f"position range {self.first}-{self.last} ends before it starts"
        return None

    def _field_word(self, name: str) -> str:
        if name == "layer":
            return "stage number" if self.kind == "drop-stage" else "layer number"
        return {"expert": "expert number", "first": "first position", "last": "last position"}[name]

    @property
    def text(self) -> str:
        """The canonical text form, e.g. 'ban-expert:3:5@12' (parse_intervention(text) gives this item back)."""
        parts = [self.kind] + [str(getattr(self, name)) for name in FIELDS[self.kind]]
        return ":".join(parts) + self.span_text

    @property
    def span_text(self) -> str:
        """'' (every position), '@P', '@P-Q' or '@P-'."""
        if self.first is None:
            return ""
        if self.last == self.first:
            return f"@{self.first}"
        return f"@{self.first}-" + ("" if self.last is None else str(self.last))

    def describe(self) -> str:
        """A sentence: 'ban expert 5 at layer 3, token 12 only'."""
        what = WHAT[self.kind].format(layer=self.layer, expert=self.expert)
        if self.first is None:
            return f"{what}, every token"
        if self.last == self.first:
            return f"{what}, token {self.first} only"
        if self.last is None:
            return f"{what}, from token {self.first} on"
        return f"{what}, tokens {self.first}–{self.last}"

    def covers(self, position: int) -> bool:
        """Whether it applies at this absolute position."""
        return self.first is None or (self.first <= position and (self.last is None or position <= self.last))

    def overlaps(self, other: "Intervention") -> bool:
        """Whether the two position ranges share a position."""
        lo = max(self.first or 0, other.first or 0)
        highs = [x.last for x in (self, other) if x.last is not None]
        return not highs or lo <= min(highs)


def parse_intervention(text: str) -> Intervention:
    """'kind[:L[:E]][@P | @P-Q | @P-]' → Intervention; InputError names the bad part."""
    if not isinstance(text, str):
        raise InputError(f"an intervention must be text such as 'ban-expert:3:5@12', got {type(text).__name__}")
    raw = text.strip()
    if len(raw) > MAX_TEXT_CHARS:
        raise InputError(f"intervention {_shown(raw)} has {len(raw):,} characters; one is at most {MAX_TEXT_CHARS} "
                         f"(such as 'ban-expert:3:5@12')")
    body, at, span = raw.partition("@")
    kind, *numbers = body.split(":")
    if kind not in KINDS:
        raise InputError(f"intervention {_shown(raw)}: unknown kind {_shown(kind)}; write one of {EXAMPLES} "
                         "(optionally followed by @P, @P-Q or @P-)")
    names = FIELDS[kind]
    if len(numbers) != len(names):
        form = ":".join([kind] + [{"layer": "K" if kind == "drop-stage" else "L", "expert": "E"}[n] for n in names])
        raise InputError(f"intervention {_shown(raw)}: '{kind}' is written {form}")
    values = {}
    for name, number in zip(names, numbers):
        word = "stage" if kind == "drop-stage" else name
        if not number.isdigit() or not number.isascii():
            raise InputError(f"intervention {_shown(raw)}: {word} {_shown(number)} is not a whole number ≥ 0")
        if len(number) > MAX_DIGITS:
            raise InputError(f"intervention {_shown(raw)}: {word} {number} has more than {MAX_DIGITS} digits")
        values[name] = int(number)
    if at:
        match = SPAN.fullmatch(span)
        if not match or not span.isascii():
            raise InputError(f"intervention {_shown(raw)}: positions {_shown(span)} must be P, P-Q or P- (token "
                             f"positions of at most {MAX_DIGITS} digits, 0 = the first prompt token)")
        first, dash, last = match.groups()
        values["first"] = int(first)
        values["last"] = int(first) if not dash else (int(last) if last else None)
    if values.get("last") is not None and values["last"] < values["first"]:
        raise InputError(f"intervention {_shown(raw)}: position range {_shown(span)[1:-1]} ends before it starts")
    return Intervention(kind, **values)


def _shown(text: str) -> str:
    """A part of a spec for a message: its repr, cut to 40 characters (escapes make a repr up to 10× the text)."""
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:38] + "…'"


def as_intervention(item: "Intervention | str") -> Intervention:
    """An Intervention as given, or parsed from its text."""
    return item if isinstance(item, Intervention) else parse_intervention(item)


def check_interventions(items: Iterable["Intervention | str"], args: "ModelArgs") -> tuple[Intervention, ...]:
    """Parse and validate interventions against a config; InputError names the item and the problem."""
    out: list[Intervention] = []
    for item in items:
        if len(out) == MAX_INTERVENTIONS:
            raise InputError(f"more than {MAX_INTERVENTIONS} interventions; a run takes at most {MAX_INTERVENTIONS}")
        iv = as_intervention(item)
        problem = _problem(iv, args)
        if problem is None:
            problem = _conflict(iv, out, args)
        if problem:
            raise InputError(f"intervention '{iv.text}': {problem}")
        out.append(iv)
    return tuple(out)


def _problem(iv: Intervention, args: "ModelArgs") -> str | None:
    """What makes one intervention impossible on this config (None: nothing)."""
    name = args.name or args.model_type or "this config"
    if iv.kind == "drop-stage":
        if not args.has_dspark:
            return f"model '{name}' has no DSpark drafter"
        if iv.layer >= args.n_draft_stages:
            return f"the DSpark drafter has stages 0..{args.n_draft_stages - 1}, not {iv.layer}"
        return None
    if iv.kind == "no-candidate-filter":
        if not any(r.uses_candidates for r in args.roles[: args.n_layers]):
            return f"model '{name}' has no candidate filter (no layer restricts its indexer to candidate blocks)"
        return None
    if iv.layer >= args.n_layers:
        return f"layer {iv.layer} is out of range: the backbone has layers 0..{args.n_layers - 1}"
    role = args.roles[iv.layer]
    if iv.kind == "engram-off" and not role.engram:
        ids = ", ".join(map(str, args.engram_layer_ids)) or "none"
        return f"layer {iv.layer} has no Engram (Engram layers: {ids})"
    if iv.kind in ("ban-expert", "force-expert"):
        if role.hash_routed:
            return (f"layer {iv.layer} is hash-routed (V4's first {args.n_hash_layers} layers): its experts are "
                    "fixed by the token id, so they cannot be banned or forced")
        if iv.expert >= args.n_routed_experts:
            return f"expert {iv.expert} is out of range: layer {iv.layer} has experts 0..{args.n_routed_experts - 1}"
    return None


def _conflict(iv: Intervention, earlier: list[Intervention], args: "ModelArgs") -> str | None:
    """What makes an intervention clash with those before it (None: nothing)."""
    for other in earlier:
        if other == iv:
            return "is given twice"
    if iv.kind not in ("ban-expert", "force-expert"):
        return None
    clashing = [o for o in earlier if o.layer == iv.layer and o.expert == iv.expert and o.kind != iv.kind
                and o.kind in ("ban-expert", "force-expert") and o.overlaps(iv)]
    if clashing:
        return f"expert {iv.expert} is both banned and forced at layer {iv.layer} at overlapping positions"
    k, n = args.n_activated_experts, args.n_routed_experts
    limit, most = (k, f"the top-k ({k})") if iv.kind == "force-expert" else (
        n - k, f"{n - k} (at least top-k = {k} of the {n} experts must stay choosable)")
    group = [o for o in earlier if o.layer == iv.layer and o.kind == iv.kind] + [iv]
    for point in sorted({o.first or 0 for o in group}):   # the most ranges overlap at one of their starts
        experts = {o.expert for o in group if o.covers(point)}
        if len(experts) > limit:
            verb = "forces" if iv.kind == "force-expert" else "bans"
            return f"{verb} {len(experts)} experts at layer {iv.layer} at token {point}, more than {most}"
    return None
