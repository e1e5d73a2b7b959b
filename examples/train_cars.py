"""A real training loop on real data under `wandb_modprof.watch`: predict a car's fuel economy
(miles per gallon) from the classic cars dataset that `vega-datasets` ships on disk (406 cars,
no network), with an offline W&B run, then write the interactive report.

    pip install 'wandb-modprof[examples]'     # or the dev extras: `make test` runs this file
    python examples/train_cars.py [--out out/cars] [--epochs 30] [--log-freq 50]

It prints the test error, then the profile's top modules, and writes `<out>/cars.html` (open it
in a browser) and `<out>/cars.modprof.json`; the offline run is in `<out>/wandb/` (`wandb sync`
uploads it, panel included).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn

import wandb_modprof

NUMERIC = ["Cylinders", "Displacement", "Horsepower", "Weight_in_lbs", "Acceleration"]
ORIGINS = ["USA", "Europe", "Japan"]


def load_cars() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cars table as tensors: standardised numeric features and model year, the origin as
    an index, miles per gallon as the target. Cars without a known MPG or horsepower (14 of
    406) are left out: the target or a feature is missing."""
    from vega_datasets import local_data

    cars = local_data.cars().dropna(subset=["Miles_per_Gallon", "Horsepower"])
    numeric = torch.tensor(cars[NUMERIC].to_numpy(), dtype=torch.float32)
    year = torch.tensor(cars["Year"].dt.year.to_numpy(), dtype=torch.float32).unsqueeze(1)
    features = torch.cat([numeric, year], dim=1)
    features = (features - features.mean(0)) / features.std(0)
    origin = torch.tensor([ORIGINS.index(o) for o in cars["Origin"]])
    mpg = torch.tensor(cars["Miles_per_Gallon"].to_numpy(), dtype=torch.float32)
    return features, origin, mpg, torch.arange(len(mpg))


class MPGRegressor(nn.Module):
    """Numeric features and a learned embedding of the car's origin, through a small MLP."""

    def __init__(self, n_features: int, hidden: int = 64) -> None:
        super().__init__()
        self.origin = nn.Embedding(len(ORIGINS), 8)
        self.body = nn.Sequential(
            nn.Linear(n_features + 8, hidden),
            nn.GELU(),
            nn.LayerNorm(hidden),
            nn.Linear(hidden, hidden),
            nn.GELU(),
        )
        self.head = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor, origin: torch.Tensor) -> torch.Tensor:
        x = torch.cat([features, self.origin(origin)], dim=1)
        return self.head(self.body(x)).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train on the cars dataset under watch().")
    parser.add_argument("--out", type=Path, default=Path("out/cars"), help="output folder")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--log-freq", type=int, default=50, help="sample every N-th step")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    torch.manual_seed(0)
    features, origin, mpg, index = load_cars()
    order = index[torch.randperm(len(index))]
    test, train = order[:80], order[80:]
    model = MPGRegressor(features.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    run = wandb.init(project="modprof-cars", dir=str(args.out), config=vars(args) | {"out": ""})
    handle = wandb_modprof.watch(model, log_freq=args.log_freq, optimizer=opt)
    for _ in range(args.epochs):
        for batch in train[torch.randperm(len(train))].split(32):
            loss = nn.functional.mse_loss(model(features[batch], origin[batch]), mpg[batch])
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.log({"train/mse": loss.item()})
    prof = handle.unwatch()  # logs the last sample and the report to the run
    model.eval()
    with torch.no_grad():
        error = (model(features[test], origin[test]) - mpg[test]).abs().mean().item()
    baseline = (mpg[train].mean() - mpg[test]).abs().mean().item()  # always the training mean
    run.log({"test/mae_mpg": error})
    run.finish()

    print(
        f"test: mean absolute error {error:.2f} miles per gallon over {len(test)} cars "
        f"(always predicting the training mean: {baseline:.2f})"
    )
    print(prof.summary(5))
    prof.save(args.out / "cars.modprof.json")
    prof.to_html(args.out / "cars.html", mode="fwd_bwd", title="MPG regressor on the cars data")
    print(f"report: {args.out / 'cars.html'}")


if __name__ == "__main__":
    main()
