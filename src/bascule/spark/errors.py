"""The error of the bascule Spark source and sink, shared by all their modules."""


class BasculeSparkError(Exception):
    """A bascule Spark source or sink cannot do what it was asked; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(f"bascule: {message}")
