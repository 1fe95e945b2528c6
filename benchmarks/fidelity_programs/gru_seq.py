"""Fidelity fixture: a GRU sequence regressor (batch_first GRU, linear head, MSE, Adam)."""
import torch
import torch.nn as nn

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
rnn = nn.GRU(8, 16, num_layers=1, batch_first=True).to(dev)
head = nn.Linear(16, 1).to(dev)
opt = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()), lr=1e-3)
for _step in range(3):
    x = torch.randn(4, 10, 8, device=dev)
    y = torch.randn(4, 1, device=dev)
    out, _ = rnn(x)
    loss = nn.functional.mse_loss(head(out[:, -1]), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", float(loss))
