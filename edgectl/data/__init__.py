"""Small data files shipped with the package."""
