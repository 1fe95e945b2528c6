"""Fidelity fixture: embeddings and losses (Embedding, EmbeddingBag, cross-entropy with label smoothing,
BCE with logits, smooth L1, KL divergence, NLL), SGD with momentum and weight decay."""
import torch
import torch.nn as nn
import torch.nn.functional as F

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
emb = nn.Embedding(50, 16).to(dev)
bag = nn.EmbeddingBag(50, 16, mode="mean").to(dev)
head = nn.Linear(32, 5).to(dev)
params = list(emb.parameters()) + list(bag.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
for _step in range(3):
    tok = torch.randint(0, 50, (8, 6), device=dev)
    feats = torch.cat([emb(tok).mean(1), bag(tok)], dim=1)
    logits = head(feats)
    y = torch.randint(0, 5, (8,), device=dev)
    loss = (F.cross_entropy(logits, y, label_smoothing=0.1)
            + F.binary_cross_entropy_with_logits(logits, F.one_hot(y, 5).float())
            + F.smooth_l1_loss(logits, torch.zeros_like(logits))
            + F.kl_div(F.log_softmax(logits, -1), F.softmax(torch.randn_like(logits), -1), reduction="batchmean")
            + F.nll_loss(F.log_softmax(logits, -1), y))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", float(loss))
