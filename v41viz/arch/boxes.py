"""The diagram's drawing model: boxes and arrows placed in diagram units (y grows downwards), before any SVG."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Box:
    key: str            # unique within the figure, e.g. "stack:layers.3-7" or "detail:layers.3.attn"
    node: str           # the module path a click selects (a graph node or a step of an opened box): the box id
    x: float
    y: float
    w: float
    h: float
    kind: str
    title: str
    subtitle: str = ""
    badge: str = ""     # "×5" on a folded group
    stacked: bool = False  # draw as a pile of cards (a folded group)
    dim: bool = False   # a submodule box (smaller text)
    covers: tuple[str, ...] = ()   # a folded group: the layer paths it stands for
    toggle: str = ""    # 'attn' / 'ffn': the box opens into its steps (draws the open/close control)
    container: bool = False        # an opened box: a frame holding its steps, title on top
    dashed: bool = False           # a step that reads another layer's output (Reuse)
    flow_x: float = 0.0            # a container: x of its flow column (where its input enters)

    @property
    def left(self) -> float:
        return self.x - self.w / 2

    @property
    def right(self) -> float:
        return self.x + self.w / 2

    @property
    def top(self) -> float:
        return self.y - self.h / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h / 2


@dataclass
class Edge:
    a: str              # Box keys ("@in" / "@out": an arrow into or out of the drawing)
    b: str
    kind: str           # flow | residual | aux | tap
    label: str = ""     # the shape the arrow carries
    route: str = "auto"  # auto | down | diag | bypass | elbow | bus | in | out (see routes.py)


@dataclass
class Layout:
    boxes: dict[str, Box] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    focus_layer: int = 0
    focus_key: str = ""          # the stack box the detail column zooms into
    detail_frame: tuple[float, float, float, float] = (0, 0, 0, 0)   # x0, y0, x1, y1
    detail_title: str = ""
    height: float = 0.0
    opened: frozenset[str] = frozenset()   # 'attn' / 'ffn': the focused layer's boxes drawn opened

    def add(self, box: Box) -> str:
        self.boxes[box.key] = box
        return box.key
