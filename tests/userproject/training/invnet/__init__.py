"""invnet: the user's MLP (plain PyTorch)."""
