"""Fidelity fixture: a causal self-attention block through F.scaled_dot_product_attention in float32,
plus a masked call, trained with Adam."""
import torch
import torch.nn as nn
import torch.nn.functional as F

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class Attn(nn.Module):
    def __init__(self, d: int = 64, h: int = 4) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


model = Attn().to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _step in range(3):
    x = torch.randn(2, 16, 64, device=dev)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    q = torch.randn(2, 4, 16, 16, device=dev)
    mask = torch.ones(16, 16, dtype=torch.bool, device=dev).tril()
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
print("loss", float(loss), float(out.sum()))
