"""``cnn``: a small ResNet-style image classifier trained with SGD + momentum.

Stem conv3x3 -> BatchNorm -> ReLU, then stages of basic residual blocks (two conv3x3 + BatchNorm,
a 1x1 projection shortcut where the shape changes, ReLU after the sum), global average pooling
and a linear classifier; max pooling after the stem in the ``resnet18`` config. ``infer`` runs in
eval mode (BatchNorm uses its running statistics) and returns logits.

Configs: ``tiny`` (default; 16x16 images, widths 8/16, one block per stage) and ``resnet18``
(ResNet-18 layout, 11.2M parameters, 64x64 images). Data: synthetic images whose class is encoded
by which quadrant is brighter, so the loss falls within a few steps.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from hal.models.workload import BaseConfig, Workload


@dataclasses.dataclass(frozen=True)
class CnnConfig(BaseConfig):
    image_size: int = 16
    channels: int = 3
    num_classes: int = 4
    widths: tuple[int, ...] = (8, 16)
    blocks: tuple[int, ...] = (1, 1)
    stem_pool: bool = False
    batch_size: int = 8
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4


CNN_CONFIGS = {
    "tiny": CnnConfig(),
    "resnet18": CnnConfig(image_size=64, num_classes=10, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2),
                          stem_pool=True, batch_size=32, lr=0.1),
}


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """``forward(images[b, c, H, W]) -> logits[b, classes]``."""

    def __init__(self, cfg: CnnConfig):
        super().__init__()
        w0 = cfg.widths[0]
        self.stem = nn.Sequential(nn.Conv2d(cfg.channels, w0, 3, 1, 1, bias=False), nn.BatchNorm2d(w0),
                                  nn.ReLU(), *( [nn.MaxPool2d(3, 2, 1)] if cfg.stem_pool else []))
        layers, cin = [], w0
        for i, (width, n) in enumerate(zip(cfg.widths, cfg.blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, cfg.num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class CnnWorkload(Workload):
    """See the module docstring."""

    name = "cnn"
    CONFIGS = CNN_CONFIGS

    def _make_model(self) -> nn.Module:
        return ResNet(self.config)

    def _make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        c = self.config
        return torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)

    def _make_batch(self, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        c = self.config
        labels = torch.randint(0, c.num_classes, (batch_size,), generator=gen)
        images = torch.randn(batch_size, c.channels, c.image_size, c.image_size, generator=gen) * 0.5
        half = c.image_size // 2
        for i, lab in enumerate(labels.tolist()):
            q = lab % 4
            r, col = (q // 2) * half, (q % 2) * half
            images[i, :, r:r + half, col:col + half] += 1.0 + 0.25 * (lab // 4)
        return {"images": images, "labels": labels}

    def _loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self.model(batch["images"]), batch["labels"])

    @torch.no_grad()
    def infer(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self._require_built()
        self.model.eval()
        return self.model(batch["images"])

    def onnx_inputs(self, batch: Mapping[str, torch.Tensor]) -> tuple[nn.Module, tuple, list[str]]:
        return self.model, (batch["images"],), ["images"]

    def estimates(self, batch_size: Optional[int] = None, seq_len: Optional[int] = None,
                  mode: str = "train") -> dict:
        from hal.models.estimate import cnn_estimates
        return cnn_estimates(self.config, self.dtype, batch_size or self.config.batch_size, mode, foreach=self.optimizer_foreach())
