"""The one exception a user of HeadLens can meet, always with a sentence a person can act on."""


class HeadLensError(ValueError):
    """Bad input or an unusable model; ``str(err)`` is the plain sentence to show."""
