"""A user's own training script, plain PyTorch (it knows nothing of epochlens): an MLP on the
arrays of an .npz (x_train, y_train, x_test, y_test), cross-entropy for integer labels, the mean
squared error for float targets. It trains on the positions of x_train that --subset lists (an
.npy of int64; without it, every sample but the holdout). It saves {"model", "epoch"} at the
epochs its config lists, its resume state after every epoch (and continues from it when started
again), and its own test metric in metrics.json. Run by the pipeline as checkpoints.source:
command (tests/workflow/test_train_command_workflow.py).
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from invnet.model import build


def save(obj, path: Path) -> None:
    """torch.save through a temporary file and a rename: a kill never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def resume_state(state_file: Path, model, opt, gen) -> int:
    """Epochs done: 0, or those of the saved state, loaded into the model, optimiser and generator."""
    if not state_file.is_file():
        return 0
    state = torch.load(state_file, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    gen.set_state(state["generator"])
    print(f"resumed from epoch {state['done']}", flush=True)
    return state["done"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume", required=True)
    parser.add_argument("--subset", default=None, help="an .npy of the positions in x_train to train on")
    args = parser.parse_args()
    cfg = json.loads(Path(args.config).read_text())
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    data = np.load(args.data)
    keep = np.flatnonzero(~data["holdout"]) if args.subset is None else np.load(args.subset)
    x, y = torch.from_numpy(data["x_train"][keep]), torch.from_numpy(data["y_train"][keep])
    print(f"training on {len(keep)} of {len(data['x_train'])} samples", flush=True)
    regression = y.is_floating_point()
    model = build(**cfg["model"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    gen = torch.Generator().manual_seed(args.seed)
    out, resume = Path(args.out), Path(args.resume)
    state_file = resume / "state.pt"
    done = resume_state(state_file, model, opt, gen)

    def loss_of(pred, target):
        if regression:
            return torch.nn.functional.mse_loss(pred, target)
        return torch.nn.functional.cross_entropy(pred, target)

    last = max(cfg["save_at"])
    while True:
        if done in cfg["save_at"]:
            save({"model": model.state_dict(), "epoch": done}, out / f"ckpt_{done}.pt")
        if done == last:
            break
        for batch in torch.randperm(len(y), generator=gen).split(cfg["batch_size"]):
            opt.zero_grad()
            loss = loss_of(model(x[batch]), y[batch])
            loss.backward()
            opt.step()
        done += 1
        save(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "generator": gen.get_state(),
                "done": done,
            },
            state_file,
        )
        print(f"epoch {done}/{last} loss {loss.item():.4f}", flush=True)
        time.sleep(float(os.environ.get("TRAIN_SLEEP", "0")))

    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(data["x_test"]))
    y_test = torch.from_numpy(data["y_test"])
    metric = loss_of(pred, y_test).item() if regression else (pred.argmax(1) == y_test).float().mean().item()
    (out / "metrics.json").write_text(json.dumps({"test_mse" if regression else "test_accuracy": metric}))


if __name__ == "__main__":
    main()
