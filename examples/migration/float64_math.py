"""Numerics that silently change on MLU: float64 math, scripted functions, integer devices."""
import torch


@torch.jit.script  # expect: jit-script
def rms(x: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(torch.mean(x * x))


def metrics(pred, target):
    err = (pred.double() - target.double()).abs()  # expect: float64, float64
    acc = torch.zeros((), dtype=torch.float64, device=pred.device)  # expect: float64
    cov = torch.cov(torch.stack([pred, target]).to(torch.double))  # expect: float64
    spectrum = torch.fft.fft(pred.to(dtype=torch.complex128))  # expect: float64
    return err.mean() + acc, cov, spectrum


def move(batch, labels):
    batch = batch.to(0)  # expect: to-int
    labels = labels.to(device=1, non_blocking=True)  # expect: to-int
    scripted = torch.jit.script(torch.nn.Linear(4, 4))  # expect: jit-script
    return batch, labels, scripted
