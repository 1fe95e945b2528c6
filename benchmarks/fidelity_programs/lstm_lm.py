"""Fidelity fixture: a word-language-model-style LSTM (embedding, 2-layer LSTM, dropout, linear decoder,
cross-entropy, SGD with gradient clipping, hidden state detached between batches)."""
import torch
import torch.nn as nn

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
ntoken, nhid, bptt, batch = 100, 32, 8, 4


class RNNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, nhid)
        self.rnn = nn.LSTM(nhid, nhid, 2, dropout=0.2)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)).view(-1, ntoken), hidden


model = RNNModel().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
hidden = tuple(torch.zeros(2, batch, nhid, device=dev) for _ in range(2))
data = torch.randint(0, ntoken, (bptt * 4 + 1, batch), device=dev)
for i in range(0, bptt * 3, bptt):
    x, y = data[i:i + bptt], data[i + 1:i + 1 + bptt].reshape(-1)
    hidden = tuple(h.detach() for h in hidden)
    opt.zero_grad()
    out, hidden = model(x, hidden)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
print("loss", float(loss))
