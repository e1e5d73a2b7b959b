"""Profile only layer3's backward, on step 3, with torch.profiler started and stopped by
`wandb_modprof.on_module`: `python examples/layer_backward.py [--out out/]`."""

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812  (the PyTorch convention)
from torch import nn
from torch.profiler import ProfilerActivity, profile

import wandb_modprof


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.skip = nn.Conv2d(cin, cout, 1, stride) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + self.skip(x))


def build_model(widths: tuple[int, ...] = (32, 64, 128, 256)) -> nn.Sequential:
    model = nn.Sequential()  # layer1 .. layer4, then the classifier head
    for i, (cin, c) in enumerate(zip((3, *widths), widths, strict=False), start=1):
        setattr(model, f"layer{i}", nn.Sequential(Block(cin, c, min(i, 2)), Block(c, c, 1)))
    model.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[-1], 10))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description="Profile layer3's backward on step 3.")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for the trace")
    out = parser.parse_args().out
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Started inside a backward, a profiler needs process-wide callbacks (see on_module).
    config = torch.profiler._ExperimentalConfig(profile_all_threads=True)
    prof = profile(activities=[ProfilerActivity.CPU], experimental_config=config)
    with wandb_modprof.on_module(  # layer3 runs once a step: its call 2 is step 3
        model.get_submodule("layer3"),
        backward_start=lambda event: prof.start() if event.call == 2 else None,
        backward_end=lambda event: prof.stop() if event.call == 2 else None,
    ):
        for _ in range(4):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(16, 3, 32, 32)), torch.randint(10, (16,))).backward()
            opt.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "layer3_backward.json"
    prof.export_chrome_trace(str(trace))
    print(f"Trace of layer3's backward on step 3 written to {trace} (open it in ui.perfetto.dev).")


if __name__ == "__main__":
    main()
