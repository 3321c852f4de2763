"""A training script that breaks: some output, then exit status 3."""

import sys

for step in range(5):
    print(f"step {step}: loss nan", flush=True)
print("Traceback (most recent call last):\nValueError: the loss is NaN", file=sys.stderr)
sys.exit(3)
