"""How the active party fuses its own bottom output with the passive parties' embeddings.

The top model's input is the fusion of one ``(B, d_i)`` tensor per party, the active
party's own first and then each passive party's in party order (SecretFlow's fuse
models offer the same choices):

==========  ==========================================  ============================
mode        top input                                   widths
==========  ==========================================  ============================
``concat``  ``[h_active | e_1 | … | e_k]`` (default)    any; the input is Σ d_i wide
``sum``     ``h_active + e_1 + … + e_k``                all equal; the input is d wide
``mean``    the sum ÷ (k + 1)                           all equal; the input is d wide
==========  ==========================================  ============================

Each passive party's cut-layer gradient is the gradient of the loss with respect to its
own input tensor, which autograd gives once the parts are leaves that require grad
(under ``sum`` every party gets the same gradient; under ``mean`` it is divided by the
number of parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FUSES = ("concat", "sum", "mean")


class FuseError(ValueError):
    """A fuse mode or a set of widths that cannot be fused; names the offending value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fuse:
    """A fuse mode over fixed part widths (the active party's first).

    Raises:
        FuseError: an unknown mode, fewer than two parts, a width below 1, or unequal
            widths under ``sum`` / ``mean`` (naming the part).
    """

    mode: str
    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.mode not in FUSES:
            raise FuseError(f"vfl.fuse = {self.mode!r}: must be one of {FUSES}")
        if len(self.widths) < 2:
            raise FuseError(f"fuse needs the active party's part and at least one passive "
                            f"party's, got {len(self.widths)} part(s)")
        for i, w in enumerate(self.widths):
            if not (isinstance(w, int) and w >= 1):
                raise FuseError(f"part {i} of the fuse has width {w!r}; must be an int >= 1")
        if self.mode != "concat":
            first = self.widths[0]
            for i, w in enumerate(self.widths[1:], start=1):
                if w != first:
                    raise FuseError(f"vfl.fuse = {self.mode!r} needs equal widths: part {i} "
                                    f"is {w} wide, the active party's is {first}")

    @property
    def out_width(self) -> int:
        """The top model's input width."""
        return sum(self.widths) if self.mode == "concat" else self.widths[0]

    def __call__(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Fuse ``parts`` (one ``(B, d_i)`` tensor per party, in order).

        Raises:
            FuseError: a different number of parts, or a part of another width or rows.
        """
        if len(parts) != len(self.widths):
            raise FuseError(f"fuse expected {len(self.widths)} parts, got {len(parts)}")
        rows = parts[0].shape[0]
        for i, (p, w) in enumerate(zip(parts, self.widths)):
            if p.dim() != 2 or p.shape[1] != w or p.shape[0] != rows:
                raise FuseError(f"part {i} of the fuse has shape {tuple(p.shape)}; expected "
                                f"({rows}, {w})")
        import torch  # here, not at the top: launchers validate configs (FUSES) without torch

        if self.mode == "concat":
            return torch.cat(list(parts), dim=1)
        total = torch.stack(list(parts)).sum(dim=0)
        return total / len(parts) if self.mode == "mean" else total


def fuse_of(cfg: Any) -> Fuse | None:
    """The fuse of a run config (:class:`parties.config.VflConfig`: ``fuse``,
    ``passive_parties``, ``embedding_dim``); None for a two-party concatenation (the
    top model's input is then ``[h_active | e]`` without a fuse object)."""
    if cfg.passive_parties == 1 and cfg.fuse == "concat":
        return None
    return Fuse(mode=cfg.fuse, widths=(cfg.model.embedding_dim,) * (1 + cfg.passive_parties))
