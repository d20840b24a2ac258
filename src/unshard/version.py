"""unshard's version, on a floor of its own so that what writes it into a file needs no import of the package."""

__version__ = "0.1.0"
