"""Build helpers for the documentation site (mkdocs hooks, a griffe extension)."""
