"""Fidelity fixture: a small convolutional classifier (Conv2d, BatchNorm2d, ReLU, max pool, adaptive
average pool, cross-entropy), SGD with momentum, then an evaluation pass."""
import torch
import torch.nn as nn

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for _step in range(3):
    x = torch.randn(8, 3, 16, 16, device=dev)
    y = torch.randint(0, 10, (8,), device=dev)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    acc = (model(x).argmax(1) == y).float().mean()
print("loss", float(loss), float(acc))
