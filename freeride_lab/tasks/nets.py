"""ResNet-18, ResNet-50 and VGG-19, written out so that no torchvision is needed.

The architectures and initialisations follow torchvision's ``resnet18``/``resnet50``/``vgg19``
(He et al. 2016; Simonyan & Zisserman 2015), so at ``width_mult=1`` and 1000 classes the
parameter counts are the canonical ones::

    ResNet-18  11,689,512      ResNet-50  25,557,032      VGG-19  143,667,240 (BN: 143,678,248)

``width_mult`` scales every channel count (and VGG's 4096-wide classifier) so that the same
networks fit a CPU step of a few hundred ms. ``build_model(arch, impl="torchvision")`` uses
torchvision's own classes where it imports; the default ``impl="own"`` is the tested path and
gives the same network on every machine. Shapes for a 224² input::

    stem     (B, 3, 224, 224) → (B, 64w, 56, 56)      conv 7x7/2 + BN + ReLU + max-pool 3x3/2
    layer1-4 (B, 64w, 56, 56) → (B, 512w·e, 7, 7)     e = 1 (BasicBlock) or 4 (Bottleneck)
    head     (B, 512w·e, 7, 7) → (B, classes)         global average pool + linear
    VGG-19   (B, 3, 224, 224) → (B, 512w, 7, 7) → (B, classes)   16 conv 3x3, 5 max-pools, 3 FC
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "ARCHS",
    "IMPLS",
    "VGG",
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "build_model",
    "resnet18",
    "resnet50",
    "vgg19",
]

#: Architectures ``build_model`` knows.
ARCHS: tuple[str, ...] = ("resnet18", "resnet50", "vgg19")
#: ``impl`` choices: this module, torchvision (error if missing), or torchvision when it imports
#: and can build the network (``width_mult`` 1), else this module.
IMPLS: tuple[str, ...] = ("own", "torchvision", "auto")

# VGG configuration "E" (19 weight layers): channels per 3x3 conv, "M" = 2x2 max-pool.
_VGG19_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
    512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
)  # fmt: skip


def _scaled(channels: int, width_mult: float) -> int:
    return max(1, round(channels * width_mult))


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual; ResNet-18/34's block (expansion 1)."""

    expansion = 1

    def __init__(
        self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(c_in, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)  # (B, planes, H/s, W/s)
        out = self.relu(self.bn1(self.conv1(x)))  # (B, planes, H/s, W/s)
        out = self.bn2(self.conv2(out))
        return torch.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 → 3x3 (strided) → 1x1 convs with a residual; ResNet-50's block (expansion 4)."""

    expansion = 4

    def __init__(
        self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(c_in, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)  # (B, 4·planes, H/s, W/s)
        out = self.relu(self.bn1(self.conv1(x)))  # (B, planes, H, W)
        out = self.relu(self.bn2(self.conv2(out)))  # (B, planes, H/s, W/s)
        out = self.bn3(self.conv3(out))  # (B, 4·planes, H/s, W/s)
        return torch.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet: stem, four stages of ``block``, global pool, linear head."""

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        layers: tuple[int, int, int, int],
        *,
        num_classes: int = 1000,
        width_mult: float = 1.0,
    ) -> None:
        super().__init__()
        widths = [_scaled(c, width_mult) for c in (64, 128, 256, 512)]
        self._c_in = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, widths[0], layers[0], stride=1)
        self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3] * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_layer(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        downsample: nn.Module | None = None
        c_out = planes * block.expansion
        if stride != 1 or self._c_in != c_out:
            downsample = nn.Sequential(_conv1x1(self._c_in, c_out, stride), nn.BatchNorm2d(c_out))
        layers: list[nn.Module] = [block(self._c_in, planes, stride, downsample)]
        self._c_in = c_out
        layers += [block(c_out, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, 64w, H/4, W/4)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (B, 512w·e, H/32, W/32)
        x = torch.flatten(self.avgpool(x), 1)  # (B, 512w·e)
        logits: torch.Tensor = self.fc(x)  # (B, classes)
        return logits


class VGG(nn.Module):
    """torchvision's VGG: 3x3 conv stack, 7x7 adaptive pool, 4096-4096-classes classifier."""

    def __init__(
        self,
        cfg: tuple[int | str, ...] = _VGG19_CFG,
        *,
        num_classes: int = 1000,
        width_mult: float = 1.0,
        batch_norm: bool = False,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                continue
            c_out = _scaled(int(item), width_mult)
            layers.append(nn.Conv2d(c_in, c_out, kernel_size=3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(c_out))
            layers.append(nn.ReLU(inplace=True))
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        hidden = _scaled(4096, width_mult)
        self.classifier = nn.Sequential(
            nn.Linear(c_in * 7 * 7, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))  # (B, 512w, 7, 7)
        logits: torch.Tensor = self.classifier(torch.flatten(x, 1))  # (B, classes)
        return logits


def resnet18(*, num_classes: int = 1000, width_mult: float = 1.0) -> ResNet:
    """ResNet-18: BasicBlock x [2, 2, 2, 2]."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes=num_classes, width_mult=width_mult)


def resnet50(*, num_classes: int = 1000, width_mult: float = 1.0) -> ResNet:
    """ResNet-50: Bottleneck x [3, 4, 6, 3]."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes=num_classes, width_mult=width_mult)


def vgg19(*, num_classes: int = 1000, width_mult: float = 1.0, batch_norm: bool = False) -> VGG:
    """VGG-19 (configuration E), optionally with BatchNorm after every conv."""
    return VGG(num_classes=num_classes, width_mult=width_mult, batch_norm=batch_norm)


def build_model(
    arch: str,
    *,
    num_classes: int = 1000,
    width_mult: float = 1.0,
    batch_norm: bool = False,
    impl: str = "own",
) -> nn.Module:
    """A freshly initialised ``arch`` network (drawing from torch's global RNG).

    Raises:
        ValueError: unknown ``arch``/``impl``, ``batch_norm`` on a ResNet, or a
            ``width_mult`` other than 1 with torchvision.
        ImportError: ``impl="torchvision"`` where torchvision does not import.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r} is unknown; valid: {', '.join(map(repr, ARCHS))}")
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is unknown; valid: {', '.join(map(repr, IMPLS))}")
    if batch_norm and arch != "vgg19":
        raise ValueError(f"batch_norm=True applies to vgg19 only, not {arch!r}; drop it")
    if impl == "torchvision" or (impl == "auto" and width_mult == 1.0):
        tv = _torchvision_models(required=impl == "torchvision")
        if tv is not None:
            if width_mult != 1.0:
                raise ValueError(
                    f"width_mult={width_mult} needs impl='own'; torchvision builds only width 1"
                )
            name = "vgg19_bn" if batch_norm else arch
            model: nn.Module = getattr(tv, name)(weights=None, num_classes=num_classes)
            return model
    if arch == "resnet18":
        return resnet18(num_classes=num_classes, width_mult=width_mult)
    if arch == "resnet50":
        return resnet50(num_classes=num_classes, width_mult=width_mult)
    return vgg19(num_classes=num_classes, width_mult=width_mult, batch_norm=batch_norm)


def _torchvision_models(*, required: bool) -> Any:
    """``torchvision.models``, or None when it does not import and is not ``required``."""
    try:
        import torchvision.models  # type: ignore[import-not-found, unused-ignore]
    except Exception as exc:  # a broken wheel raises more than ImportError
        if required:
            raise ImportError(
                f"impl='torchvision' but torchvision does not import ({exc}); use impl='own'"
            ) from exc
        return None
    return torchvision.models
