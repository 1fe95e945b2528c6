"""Fidelity fixture: an MLP classifier trained the usual CUDA way (AdamW, autocast, GradScaler, dropout,
cross-entropy, gradient clipping). Runs on CUDA when present, else on the CPU."""
import torch
import torch.nn as nn

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
scaler = torch.cuda.amp.GradScaler(enabled=dev.type == "cuda")
for _step in range(4):
    x = torch.randn(16, 32, device=dev)
    y = torch.randint(0, 10, (16,), device=dev)
    with torch.autocast(device_type=dev.type, dtype=torch.float16 if dev.type == "cuda" else torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
print("loss", float(loss))
