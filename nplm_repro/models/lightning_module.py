"""The LightningModule around eq. (1) (models/nplm.py): its keys, its three outputs (the softmax, the energy
network, word classes) and the two optimiser recipes; exact perplexity, the output layer and the loss's bookkeeping
are every trained family's (LanguageModule, language_module.py).

Both recipes are SGD with weight decay, the learning rate `optim.lr` counted per training word:
- `paper`: eps_t = eps_0 / (1 + r t) (p.1147), eps_0 = 1e-3, t counting training words. The paper updates
  after every word; we average the loss over a mini-batch of B words and take the step B * eps_t, so one
  mini-batch moves the weights as far as the paper's B single-word updates would (to first order), and
  weight decay lambda shrinks them by B * eps_t * lambda per batch, as the paper's per-update decay does.
  Under DDP with W processes of B words each, one step averages W x B words, and B counts them all.
- `fast`: 5 times the paper's rate on batches of 256, multiplied by `plateau_factor` after each epoch that
  does not improve validation perplexity (early stopping ends training two such epochs later).
The decay and the drop are knobs either recipe can take (schedules.py), for going from one recipe to the other.
Weight decay applies to C, H, U, W, never to the biases b and d (p.1142).

Stored runs name NPLMModule by this module's path (their config's `model._target_`, an MLflow Model's `module`), and
families outside the package import LanguageModule from it: both stay importable here. A class that moved out is
named where it lives by nplm_repro/migrations.py (`upgrade_config`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.splits import Sizes
from nplm_repro.data.windows import NgramWindows, WindowBatches
from nplm_repro.errors import NplmError
from nplm_repro.models import asynchronous, parallel
from nplm_repro.models.features import FEATURES, lsi_features
from nplm_repro.models.language_module import LanguageModule, word_classes
from nplm_repro.models.nplm import NPLM
from nplm_repro.models.outputs import OUTPUTS, Head, outputs_for, training_of
from nplm_repro.models.plain_loop import ExactLoop, SampledLoop
from nplm_repro.models.sampled_loss import Proposal, SparseSGD
from nplm_repro.models.schedules import schedules
from nplm_repro.rules import Rule, at_least, flag, number, one_of, optional


class NPLMModule(LanguageModule):
    family = "mlp"
    label = "MLP"
    bench_lines = (*LanguageModule.bench_lines, "baseline", "plain", "mixture", "parallel")
    blocks = False  # its processes split the output units (trainer.strategy=parameter_parallel: models/parallel.py)

    @classmethod
    def kind(cls, cfg: Any) -> str:
        """trained; a run stored with `model.mix` (the paper's mixed rows before they were `model=mixture` rows of
        their own: CHANGELOG.md) is mixed: its MLP and the interpolated trigram, which the mixture's module scores
        again (baselines/mixture.py `StoredMixedRow`)."""
        return "trained" if cfg.model.get("mix", "none") == "none" else "mixed"

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        return super().rules(cfg) | {
            "model.n": at_least(2),
            "model.m": at_least(1),
            "model.h": at_least(0),
            "model.direct": flag(),
            "model.features": one_of(*FEATURES),
            "model.output": one_of(*outputs_for(cls.family)),  # eq. (1)'s softmax, §5.1's energy network, classes
            "optim.recipe": one_of("paper", "fast"),
            # the recipes' rate schedules, each on when set (`schedules`); torch drops only by a factor < 1
            "optim.decay_rate": optional(number(0)),
            # output units in blocks over the processes (§3.2), or shared weights (§3.1)
            "trainer.strategy": one_of("auto", "ddp_spawn", parallel.STRATEGY, *asynchronous.STRATEGIES),
        }

    @classmethod
    def tags(cls, cfg: Any) -> dict[str, str]:
        return super().tags(cfg) | asynchronous.tags(cfg)

    @classmethod
    def check(cls, cfg: Any) -> None:
        super().check(cfg)
        if cfg.trainer.strategy == parallel.STRATEGY:
            parallel.check_blocks(cfg)
        if cfg.trainer.strategy in asynchronous.STRATEGIES:
            asynchronous.check(cfg)
        if cls.kind(cfg) == "mixed":
            raise NplmError(
                "model.mix: an MLP mixed with the interpolated trigram is a row of its own, model=mixture with "
                "model.components=[<the MLP's row>,Del. Int.] and model.mode (conf/experiment/mlp2.yaml)"
            )
        if cfg.model.h == 0 and not cfg.model.direct:
            raise NplmError(
                "model.h=0 needs model.direct=true (without hidden units, W is the only path to the output)"
            )
        o = cfg.optim
        if o.get("anneal_to_time"):
            raise NplmError(
                "optim.anneal_to_time is adamw's (the LSTM's and the Transformer's recipe): eq. (1)'s paper and fast "
                "recipes have no cosine to end at trainer.max_time"
            )
        # SparseSGD keeps the log of each step's decay factor, 1 - lr x batch_size x weight_decay (one device)
        if training_of(o).sampled and o.lr * o.batch_size * o.weight_decay >= 1:
            raise NplmError(
                f"optim.lr={o.lr} x optim.batch_size={o.batch_size} x optim.weight_decay={o.weight_decay} = "
                f"{o.lr * o.batch_size * o.weight_decay:.3g}: sampled training decays the weights by 1 - that "
                f"product a step, so it must be < 1 (optim.lr < {1 / (o.batch_size * o.weight_decay):.4g} here)"
            )

    @classmethod
    def check_sizes(cls, cfg: Any, sizes: Sizes) -> None:
        super().check_sizes(cfg, sizes)
        parallel.check_block_sizes(cfg, sizes)

    def __init__(
        self,
        vocab_size: int,
        n: int,
        m: int,
        h: int,
        direct: bool,
        optim: dict[str, Any],
        features: str = "learned",
        lsi: torch.Tensor | None = None,
        output: str = "standard",
        classes: int | None = None,
        class_method: str = "exchange",
        word_classes: torch.Tensor | None = None,
    ) -> None:
        """`features`: C learned with the rest, or frozen (models/features.py) at `lsi` (fixed_lsi, computed from
        the training split by the caller; a checkpoint restores it without) or at its random start (fixed_random).
        `output` (models/outputs.py OUTPUTS): eq. (1)'s softmax over V, the energy network of §5.1 (its own network,
        models/energy.py), or eq. (1) with a word-class output layer (models/classes.py) of `classes` classes,
        `word_classes` (computed by the caller by `class_method`; a checkpoint restores them without)."""
        super().__init__()
        # kept for load_from_checkpoint (the state dict holds C and the word classes); the run logs the config itself
        self.save_hyperparameters(ignore=["lsi", "word_classes"], logger=False)
        chosen = OUTPUTS[output]  # its network first: the random draws of a seed's weights come in this order
        self.model = (chosen.network or NPLM)(vocab_size, n, m, h, direct)
        if not chosen.scores_train:
            self.evaluated = ("valid", "test")
        widths = [(n - 1) * m] * direct + [h] * bool(h)  # NPLM.output_terms: (x, W), (tanh(d + Hx), U)
        self._output_layer(vocab_size, output, classes, widths, word_classes)
        if lsi is not None:
            self.model.C.data.copy_(lsi)
        self.model.C.requires_grad_(features == "learned")
        self.optim = dict(optim)
        self._reset()

    @classmethod
    def build(cls, cfg: Any, corpus: Corpus) -> NPLMModule:
        """Eq. (1) for `cfg.model` on `corpus`'s vocabulary. With model.features=fixed_lsi, C starts from the training
        split's co-occurrence counts within n-1 words, reduced to m principal directions (models/features.py)."""
        architecture = {k: v for k, v in cfg.model.items() if k not in ("mix", "_target_")}
        lsi = None
        if architecture.get("features", "learned") == "fixed_lsi":
            start, end = corpus.bounds["train"]
            lsi = lsi_features(corpus.ids[start:end].numpy(), corpus.vocab_size, cfg.model.n - 1, cfg.model.m, cfg.seed)
        architecture |= word_classes(cfg.model, corpus)
        module = cls(vocab_size=corpus.vocab_size, optim=dict(cfg.optim), lsi=lsi, **architecture)
        module.blocks = cfg.trainer.get("strategy") == parallel.STRATEGY
        return module

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """Log-probabilities log P(w | context), [batch, |V|], from float32 logits."""
        with self._float32():
            return self.layer.log_probs(self.head((context, None), training=False))

    @property
    def reads(self) -> NgramWindows:
        """Eq. (1) reads windows of n words (data/windows.py); each process its own batches under DDP, every process
        every batch when they split the output units (`blocks`)."""
        return NgramWindows(self.model.n, shard=not self.blocks)

    @property
    def readers(self) -> int:
        """Processes that split the output units all read the same batches: they count as one reader."""
        return 1 if self.blocks else self.trainer.world_size

    def next_logprobs(self, contexts: list[list[int]]) -> torch.Tensor:
        need = self.context_needed
        return self(torch.tensor([ids[-need:][::-1] for ids in contexts], dtype=torch.int64))  # w_{t-1} first

    @property
    def context_needed(self) -> int:
        return self.model.n - 1

    @property
    def score_reach(self) -> int:
        return self.model.n - 1

    def word_features(self) -> torch.Tensor:
        return self.model.C.detach()

    @property
    def output_width(self) -> int:
        """x through W (when direct) and tanh(d + Hx) through U."""
        model = self.model
        return (model.n - 1) * model.m * bool(model.direct) + model.h

    def flops_per_token(self, rows: float) -> float:
        model = self.model
        return 2.0 * ((model.n - 1) * model.m * model.h + self.output_width * rows)

    def head(self, batch: tuple[torch.Tensor, torch.Tensor | None], training: bool) -> Head:
        """Eq. (1)'s output terms (x, W), (tanh(d + Hx), U), or the own logits and sampled outputs of an output's own
        network (the energy network's), whose y is no sum of products."""
        context, target = batch
        model, own = self.model, self.output.own_scores
        return Head(
            target,
            model.b,
            None if own else functools.partial(model.output_terms, context),  # terms(rows)
            previous=context[:, 0],
            logits=functools.partial(model, context),
            outputs=functools.partial(model.sampled_outputs, context) if own else None,
        )

    def _weighed(self, loss: torch.Tensor, tokens: int) -> torch.Tensor:
        """The step is lr x batch_size words of mean loss: a short last batch of k words weighs k, not batch_size."""
        return loss if tokens == self.optim["batch_size"] else loss * (tokens / self.optim["batch_size"])

    def proposal_pairs(self, batches: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each training window's target and its w_{t-1}."""
        if not isinstance(batches, WindowBatches):
            return None
        rows = batches.rows.cpu()
        return rows[:, -2], rows[:, -1]

    # trainer.strategy=parameter_parallel (models/parallel.py): each process keeps its block of the output units
    def configure_model(self) -> None:
        if self.device_mesh is not None and not parallel.is_blocked(self.model):
            parallel.block(self.model, self.device_mesh)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return parallel.on_mesh(batch, self.model) if parallel.is_blocked(self.model) else batch

    def on_train_start(self) -> None:
        super().on_train_start()
        if parallel.is_blocked(self.model):
            self.layer = parallel.BlockSoftmax()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        with parallel.blocked_loss(self.model):
            super().backward(loss, *args, **kwargs)

    def on_fit_end(self) -> None:
        parallel.unblock(self.model)  # the whole weights, which the spawned processes hand back

    def plain_loop(self, precision: str, batches: WindowBatches) -> SampledLoop | ExactLoop:
        """This module's training step on `batches` as the simplest loop that computes the same (models/plain_loop.py):
        nplm-bench's floor. Eq. (1)'s own output layer only: the energy network's step is its own."""
        if not self.output.plain_loop:
            raise ValueError(
                f"the plain loop computes eq. (1)'s output layer; model.output={self.output.name} has none"
            )
        if training_of(self.optim).sampled:
            pairs = self.proposal_pairs(batches)
            proposal = Proposal(*pairs, self.model.C.shape[0], self.optim["proposal"]).to(self.device)
            return SampledLoop(self.model, proposal, self.optim)
        return ExactLoop(self.model, self.classes, self.optim, precision)

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[dict[str, Any]]]:
        o = self.optim
        layer = [] if self.classes is None else [self.classes]  # the class layer: its weights decay, bc does not
        groups = [
            {"params": self.model.decayed() + [p for c in layer for p in c.Kc], "weight_decay": o["weight_decay"]},
            {"params": self.model.biases() + [c.bc for c in layer], "weight_decay": 0.0},
        ]
        # DDP averages the processes' gradients: one batch of W x B; processes that split the output units, one of B
        batch = o["batch_size"] * parallel.data_parallel_size(self.trainer)
        # lr is per training word (module doc); fused: decay and step in one pass over each weight, not three
        if training_of(o).sampled:  # sparse gradients: the same update, on the sampled rows only
            # the word rows' decay waits until a step reads the row (SparseSGD)
            optimizer = SparseSGD(groups, lr=o["lr"] * batch, lazy=self.model.word_rows())
        else:
            optimizer = torch.optim.SGD(groups, lr=o["lr"] * batch, fused=not parallel.is_blocked(self.model))
        return [optimizer], schedules(optimizer, o.get("decay_rate"), o.get("plateau_factor"), batch)
