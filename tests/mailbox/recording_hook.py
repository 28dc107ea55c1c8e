"""A hook for the mailboxes' `on_ignored`, shared by the hostile-store tests."""


class Hook:
    """An on_ignored hook that records what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, key: str, reason: str) -> None:
        self.calls.append((key, reason))

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.calls]
