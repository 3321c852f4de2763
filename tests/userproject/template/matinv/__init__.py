"""matinv: a user's MLP that inverts 3x3 matrices (seed 004's regression), plain PyTorch."""
