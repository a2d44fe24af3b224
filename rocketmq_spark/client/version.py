"""The package's version, where the client (which must not import the package root) can read it."""

__version__ = "0.1.0"
