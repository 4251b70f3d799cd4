"""The release, in a module of its own so that any layer can name it without importing the
package's public face (which loads the app); pyproject.toml reads it from here, the one
place it is written."""

__version__ = "0.1.0"
