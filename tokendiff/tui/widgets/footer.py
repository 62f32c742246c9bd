"""The footer every screen uses: Textual's, recomposed only when the keys it shows change.

Textual's Footer rebuilds all its key widgets whenever the screen's bindings are updated, which
is on every focus change and every `refresh_bindings`, even when the shown keys are the same:
on the pair screen that was most of what `m` cost (~100 ms of CPU) and ten rebuilds before the
first complete screen.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from textual.message import Message
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.screen import Screen


def shown_keys(screen: Screen[Any]) -> tuple[Hashable, ...]:
    """Everything the footer draws from the screen's bindings: each shown key and the palette's."""
    app = screen.app
    palette = app.COMMAND_PALETTE_BINDING
    return tuple(
        (key, b.key, app.get_key_display(b), b.description, b.action, b.group, enabled, tooltip)
        for key, (_, b, enabled, tooltip) in screen.active_bindings.items()
        if b.show or key == palette
    )


def _without_description(entry: Hashable) -> tuple[Hashable, ...]:
    """A shown key's entry (see shown_keys) but its description."""
    t: tuple[Hashable, ...] = tuple(entry)  # type: ignore[arg-type]
    return t[:3] + t[4:]


class KeyFooter(Footer):
    """A Footer that skips the rebuild when the keys it would show are the ones it shows, or the ones
    a rebuild already scheduled will show (a rebuild reads the keys when it runs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wanted: tuple[Hashable, ...] | None = None  # the keys drawn, or those a scheduled rebuild draws
        self._drawn = False

    class Drawn(Message):
        """The footer has composed its keys (the first time, or after they changed)."""

    @property
    def drawn(self) -> bool:
        """Whether the keys are composed (not only scheduled)."""
        return self._drawn

    def _relabel(self, keys: tuple[Hashable, ...]) -> bool:
        """Only a description changed (`m`'s label names the other mode): the drawn keys relabelled in place,
        no rebuild. False when anything else changed, or the keys are not drawn yet."""
        old = self._wanted
        if not self._drawn or old is None or len(old) != len(keys):
            return False
        changed = [(o, k) for o, k in zip(old, keys, strict=True) if o != k]
        if any(_without_description(o) != _without_description(k) for o, k in changed):
            return False
        widgets = {(w.key, w.action): w for w in self.query(FooterKey)}
        for _, new in changed:
            widget = widgets.get((new[1], new[4]))  # type: ignore[index]
            if widget is None:
                return False
            widget.description = str(new[3])  # type: ignore[index]
            widget.refresh(layout=True)
        self._wanted = keys
        return True

    def compose(self) -> ComposeResult:
        drew = False
        for widget in super().compose():  # passed on as they come: a `with` group in there must stay open
            drew = True
            compact = getattr(type(widget), "compact", None)
            if compact is not None and not widget.has_class("-command-palette"):
                # a key, which Footer binds to its own `compact`: given it now, it is not restyled twice at
                # mount (its default, then the footer's), ~10 ms of every screen with a footer
                widget.set_reactive(compact, self.compact)
            yield widget
        self._wanted = shown_keys(self.screen) if drew else None
        if drew:
            self._drawn = True
            self.post_message(self.Drawn())

    def bindings_changed(self, screen: Screen[Any]) -> None:
        keys = shown_keys(screen)
        if keys == self._wanted and screen is self.screen:
            return
        if screen is self.screen and self._relabel(keys):
            return
        super().bindings_changed(screen)
        if screen.app.app_focus and self.is_attached and screen is self.screen:  # Footer scheduled a rebuild
            self._wanted = keys
