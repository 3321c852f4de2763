"""tinyvit: a user's small vision transformer (a stand-in for a researcher's own repository)."""
