"""Losses: heated-up softmax, the mean-proxy regularizer and instance cross entropy.

Every loss in :data:`LOSSES` is an ``nn.Module`` with the same contract:

- ``from_config(config, num_classes)`` builds it from a ``TrainConfig``;
- ``forward(embeddings (B, D), labels (B,)) -> scalar``; after a call, ``stats``
  holds detached means over that batch (``accuracy`` always; the softmax adds
  ``mean_proxy_norm``), so an epoch's value of each is their mean weighted by
  batch size;
- ``set_alpha(alpha)`` applies the heating schedule's alpha (a no-op for a loss
  without a temperature);
- ``schedule_metrics()`` returns the values the schedule set, to report once per
  epoch (``{"alpha_now": ...}`` for the softmax, ``{}`` otherwise), named apart
  from the config key it starts from.

- :class:`HeatedSoftmaxLoss`: cross entropy of p(m|x) = softmax(alpha * z)_m with
  z_m = <f, w_m> (+ b_m) (000_4178e6910e81cd2f, eqs. 1-2; gradient eq. 3), with
  l2-normalized weights when ``weight_norm``; alpha fixed or learned, scaled
  by the heating schedule; plus ``mean_proxy_weight`` * ||mean_c w_hat_c||_2
  (002_ad8188f3a39a9075, eq. 3.10).
- :class:`ICELoss`: instance cross entropy (004_44fc264e74e143df, eqs. 3-5) with
  similarity scale s; its gradient is the per-anchor rescaled weighting of
  eqs. 11-15, not the plain gradient of eq. 5.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from .config import TrainConfig


def mean_proxy_norm(weight: torch.Tensor) -> torch.Tensor:
    """||(1/M) sum_c w_c / ||w_c|| ||_2 for class weights (M, D): eq. 3.10 of 002_ad8188f3a39a9075."""
    return F.normalize(weight, dim=1).mean(dim=0).norm()


class HeatedSoftmaxLoss(nn.Module):
    """Softmax cross entropy with inverse temperature alpha over a (cosine) classifier.

    logits (B, M) = alpha_eff * f @ w_hat.T (+ bias), alpha_eff = alpha * heat,
    where ``heat`` (set by :meth:`set_alpha`) is alpha_schedule(epoch) / alpha_init.
    With ``learn_alpha`` alpha is a parameter, initialised at ``alpha``.
    """

    @classmethod
    def from_config(cls, config: TrainConfig, num_classes: int) -> HeatedSoftmaxLoss:
        """A classifier over ``num_classes`` proxies of ``config.embedding_dim`` dimensions."""
        return cls(
            num_classes,
            config.embedding_dim,
            alpha=config.alpha,
            learn_alpha=config.learn_alpha,
            weight_norm=config.weight_norm,
            mean_proxy_weight=config.mean_proxy_weight,
        )

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        *,
        alpha: float = 16.0,
        learn_alpha: bool = False,
        weight_norm: bool = True,
        bias: bool | None = None,
        mean_proxy_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_dim))
        nn.init.normal_(self.weight, std=embedding_dim**-0.5)
        # A bias only goes with raw weights (plain softmax): on the unit sphere it would
        # let classes win without moving their proxies.
        self.bias = nn.Parameter(torch.zeros(num_classes)) if (not weight_norm if bias is None else bias) else None
        alpha_t = torch.tensor(float(alpha))
        if learn_alpha:
            self.alpha = nn.Parameter(alpha_t)
        else:
            self.register_buffer("alpha", alpha_t)
        self.register_buffer("heat", torch.tensor(1.0))
        self.initial_alpha = float(alpha)
        self.weight_norm, self.mean_proxy_weight = weight_norm, mean_proxy_weight
        self.stats: dict[str, float] = {}

    @property
    def current_alpha(self) -> float:
        """The inverse temperature the logits are scaled by now: alpha (learned or fixed) x heat."""
        return float(self.alpha.detach() * self.heat)

    def set_alpha(self, alpha: float) -> None:
        """Heat to the schedule's ``alpha``: heat = alpha / alpha_init.

        With a fixed alpha, :attr:`current_alpha` becomes ``alpha``; with a learned
        one, ``alpha`` x (learned alpha / alpha_init). Cheap enough to call every step.
        """
        self.heat.fill_(alpha / self.initial_alpha)

    def schedule_metrics(self) -> dict[str, float]:
        """``{"alpha_now": current_alpha}``: the inverse temperature trained with (``alpha`` is the config's start value)."""
        return {"alpha_now": self.current_alpha}

    def logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        weight = F.normalize(self.weight, dim=1) if self.weight_norm else self.weight
        logits = (self.alpha * self.heat) * (embeddings @ weight.t())
        return logits if self.bias is None else logits + self.bias

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.logits(embeddings.float())
        loss = F.cross_entropy(logits, labels)
        proxy_norm = mean_proxy_norm(self.weight)
        if self.mean_proxy_weight > 0:
            loss = loss + self.mean_proxy_weight * proxy_norm
        self.stats = {
            "accuracy": float((logits.detach().argmax(1) == labels).float().mean()),
            "mean_proxy_norm": float(proxy_norm.detach()),
        }
        return loss


def ice_terms(sim: torch.Tensor, labels: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ICE value and the per-pair gradient weights of eqs. 13-14 for a similarity matrix.

    sim: (N, N) cosine similarities f_a^T f_b; labels (N,).
    Returns (loss, grad) where loss = (1/N) sum_a sum_{i in P(a)} -log p_hat(i|a)
    (eq. 5 with the rescaled probabilities of eqs. 11-12, averaged over
    anchors) and grad (N, N) = dL/dsim as prescribed by eq. 15: -w_bar(i; a)
    for positives (eq. 13), +w_bar(j; a) for negatives (eq. 14), 0 elsewhere.
    Anchors without a positive or a negative in the batch are left out.
    """
    n = sim.shape[0]
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(n, dtype=torch.bool, device=sim.device)
    pos, neg = same & ~eye, ~same
    valid = pos.any(1) & neg.any(1)
    logits = scale * sim
    minus_inf = torch.finfo(logits.dtype).min
    lse_neg = torch.logsumexp(logits.masked_fill(~neg, minus_inf), dim=1)  # log sum_j exp(s f_a.f_j)
    # D[a, i] = log(exp(s f_a.f_i) + sum_j exp(s f_a.f_j)): the denominator of eqs. 3-4, 11-12
    denom_log = torch.logaddexp(logits, lse_neg[:, None])
    log_p = logits - denom_log  # log p_hat(i|a), eq. 3 with scale s
    loss = -(log_p * pos).sum() / valid.sum().clamp(min=1)

    with torch.no_grad():
        one_minus_p = torch.sigmoid(lse_neg[:, None] - logits) * pos  # w_hat of positives, eq. 11
        total = one_minus_p.sum(1).clamp(min=torch.finfo(sim.dtype).tiny)  # sum_i (1 - p_hat(i|a))
        n_valid = valid.sum().clamp(min=1)
        w_pos = one_minus_p / (2 * n_valid * total[:, None])  # eq. 13
        # sum_i p_hat(j|a,i) = exp(s f_a.f_j) * sum_i exp(-D[a, i]), eq. 12
        log_sum_inv = torch.logsumexp((-denom_log).masked_fill(~pos, minus_inf), dim=1)
        # masked before exp: masked entries could overflow and inf * 0 would be NaN
        w_neg = torch.exp((logits + log_sum_inv[:, None]).masked_fill(~neg, float("-inf"))) / (2 * n_valid * total[:, None])  # eq. 14
        grad = (w_neg - w_pos) * valid[:, None]
    return loss, grad


class ICELoss(nn.Module):
    """Instance cross entropy over a batch of C classes x k images, scale s.

    embeddings (B, D) are l2-normalized here (eq. 6); the loss value is eq. 5
    (averaged over anchors) and its gradient w.r.t. the similarities is eq. 15.
    """

    @classmethod
    def from_config(cls, config: TrainConfig, num_classes: int) -> ICELoss:
        """ICE at scale ``config.ice_scale``; it has no class weights, so ``num_classes`` is unused."""
        return cls(scale=config.ice_scale)

    def __init__(self, scale: float = 64.0) -> None:
        super().__init__()
        self.scale = scale
        self.stats: dict[str, float] = {}

    def set_alpha(self, alpha: float) -> None:
        """No-op: ICE's scale s is fixed; heating applies to the softmax only."""

    def schedule_metrics(self) -> dict[str, float]:
        """``{}``: nothing in ICE follows a schedule."""
        return {}

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        f = F.normalize(embeddings.float(), dim=1)
        sim = f @ f.t()
        loss, grad = ice_terms(sim.detach(), labels, self.scale)
        # value of eq. 5, gradient of eq. 15: d(surrogate)/d(sim) == grad
        surrogate = (grad * sim).sum()
        with torch.no_grad():
            nearest = (sim - 3 * torch.eye(len(sim), device=sim.device)).argmax(1)  # self excluded
            accuracy = float((labels[nearest] == labels).float().mean())
        self.stats = {"accuracy": accuracy}
        return loss + surrogate - surrogate.detach()


# config.loss -> loss class; its keys are the values TrainConfig allows for ``loss``.
LOSSES: dict[str, type[HeatedSoftmaxLoss] | type[ICELoss]] = {"softmax": HeatedSoftmaxLoss, "ice": ICELoss}


def build_loss(config: TrainConfig, num_classes: int) -> HeatedSoftmaxLoss | ICELoss:
    """The loss of ``config`` (``config.loss`` names it in :data:`LOSSES`) for ``num_classes`` training classes."""
    return LOSSES[config.loss].from_config(config, num_classes)
