"""LanguageModule: what every trained family's LightningModule shares (eq. (1)'s is lightning_module.py's
NPLMModule; the LSTM's and the Transformer's, sequence.py's SequenceModule), and what its callers ask of it.

Perplexity is exp(mean negative log-likelihood) over every token of a split, from the exact softmax of
float32 logits, with the per-token terms summed in float64.

The output layer is the run's `layer` (outputs.py), chosen once training starts: `trainer.precision=bf16-mixed`
trains with the softmax's products in bfloat16 (bf16_loss.py, about 3x faster on a CPU with bf16 units);
`optim.output=sampled` in float32 with the output layer's gradient estimated from `optim.samples` words drawn from a
proposal (sampled_loss.py); `model.output=classes` with a word-class softmax (classes.py). Evaluation is the exact
float32 distribution whatever the training used.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch

from nplm_repro.data.clustering import OUTPUT_METHODS, output_classes
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.module import Reading
from nplm_repro.data.splits import SPLITS, Sizes
from nplm_repro.data.streams import StreamBatches
from nplm_repro.data.windows import WindowBatches
from nplm_repro.errors import NplmError
from nplm_repro.family import Family, Job, Recorded, Tokens
from nplm_repro.models.classes import ClassOutput
from nplm_repro.models.outputs import (
    OUTPUTS,
    TRAININGS,
    Head,
    Output,
    OutputLayer,
    Softmax,
    choose,
    output_of,
    training_of,
)
from nplm_repro.models.precision import PRECISIONS
from nplm_repro.models.sampled_loss import ESTIMATORS, PROPOSALS, Proposal, SparseSGD
from nplm_repro.models.training import score_splits, train_neural
from nplm_repro.rules import Rule, at_least, number, one_of, optional
from nplm_repro.scores import Scores

_limit: Rule = (lambda v: type(v) is int and (v == -1 or v >= 1), "an integer >= 1, or -1 for no limit")
TRAINING: dict[str, Rule] = {
    "optim.lr": number(0, low_open=True),
    "optim.weight_decay": number(0),
    "optim.batch_size": at_least(1),
    "optim.output": one_of(*TRAININGS),
    "optim.plateau_factor": optional(number(0, 1, low_open=True, high_open=True)),
    "trainer.precision": one_of("auto", *PRECISIONS),  # bf16-mixed: products in bfloat16, eval float32
    # 0 would train nothing and score the initial weights as if they were a model; -1 is Lightning's "no limit"
    "trainer.max_epochs": optional(_limit),
    "trainer.max_steps": optional(_limit),
    # ddp_spawn keeps the job (its MLflow run, its lock) in this process; ddp would re-run the whole command
    "trainer.strategy": one_of("auto", "ddp_spawn"),
}
OUTPUT: dict[str, Rule] = {  # the word-class output layer (§5.2), any family's: models/classes.py
    "model.classes": optional(at_least(2)),
    "model.class_method": one_of(*OUTPUT_METHODS),
}
SAMPLED: dict[str, Rule] = {
    "optim.samples": at_least(1),
    "optim.proposal": one_of(*PROPOSALS),
    "optim.estimator": one_of(*ESTIMATORS),
    # sampled training computes in float32: bf16-mixed would be recorded but not used
    "trainer.precision": one_of("auto", "32-true"),
    "trainer.devices": one_of(1),  # its sparse gradients are not tried under DDP
}


# A mean loss (nats a token) whose perplexity exp(loss) overflows float64: a model this far off is no model, and its
# perplexity would be recorded as inf (which MLflow's SQL store keeps as 1.8e308). Far above any loss of a model that
# learns: the uniform distribution over Brown's vocabulary has ln |V| = 9.8.
LOSS_LIMIT = math.log(sys.float_info.max)
# A validation perplexity this many times |V| (a model giving every word the same probability scores |V|) is no
# model that learned: it diverged, though its numbers are finite (MLP9 at optim.lr=0.05 on a tiny corpus: 343 nats)
FAR_ABOVE_UNIFORM = 10.0
DIVERGED = "the model diverged (try a smaller optim.lr)"


RNG_KEY = "nplm_rng_states"  # the checkpoint's entry for the random generators (`on_save_checkpoint`)


class LanguageModule(L.LightningModule, Family):
    """What every trained family's LightningModule shares, and what its callers ask of it beyond the family's
    contract (nplm_repro/family.py).

    Shared: exact evaluation (every token of a split once, the float32 softmax, per-token terms summed in float64),
    the training loss's bookkeeping and tokens/s. Asked, so that no caller names a family: `reads` (what the
    model reads of a split), `next_logprobs` (the next word's distribution after contexts, for generation and the
    MLflow Model), `context_needed` and `word_features` (the input embedding, for the features artifacts).
    Its output layer is asked too (models/outputs.py): a subclass defines `head` (what the layer reads of a batch),
    and the run's `layer` (exact float32, bfloat16, sampled or word classes) turns it into the training loss, the
    exact scores and the next word's distribution, so no training step names an output layer or a model class.
    A subclass defines `head`, `proposal_pairs` and those four.
    """

    trained = True  # by Lightning: weights, a Model (nplm_repro/family.py)
    # nplm-bench's lines for it: eq. (1) adds a plain PyTorch NPLM (`baseline`) and its mixtures with the trigram
    bench_lines = ("matmul", "train", "sampled", "profile", "classes", "eval")
    evaluated = SPLITS  # the splits a run scores at its end (a slow scorer leaves out train, which no report needs)
    optim: dict[str, Any]
    _slots: list[int] | None = None
    _resumed_rng: dict[str, Any] | None = None  # the generators' states a checkpoint brought, until training starts
    output: Output = OUTPUTS["standard"]  # model.output: the distribution it gives (models/outputs.py)
    classes: ClassOutput | None  # model.output=classes: the class layer (its weights, its words' classes)
    proposal: Proposal | None = None  # sampled training's, counted on the training split when training starts
    layer: OutputLayer = Softmax()  # the output layer (`choose`): exact until training picks the run's own

    def __init__(self) -> None:
        super().__init__()
        self.classes = None  # an instance's, not the class's: nn.Module finds a submodule only where nothing shadows it

    def score_as(self, splits: Sequence[str]) -> None:
        """`Trainer.test`'s dataloader i is split `splits[i]` (its perplexity is logged under that name); a span that is
        no split (a user's text) takes slot i, as it always did."""
        self._slots = [SPLITS.index(s) if s in SPLITS else i for i, s in enumerate(splits)]

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        """The values of the keys this family reads that make sense (config_checks.check_config applies them)."""
        rules = dict(TRAINING)
        if output_of(cfg.model).word_classes:  # a family without the class keys needs none of them otherwise
            rules |= OUTPUT
        if training_of(cfg.optim).sampled:
            rules |= SAMPLED
        return rules

    @classmethod
    def check(cls, cfg: Any) -> None:
        """What its values must satisfy together, beyond each key's rule: raise NplmError in one line."""
        output = output_of(cfg.model)
        if not output.trains_sampled and training_of(cfg.optim).sampled:
            raise NplmError(f"model.output={output.name} trains exactly (optim=fast or paper): {output.exact_only}")
        if output.needs and not output.needs[0](cfg.model):
            raise NplmError(f"model.output={output.name} needs {output.needs[1]}")

    @classmethod
    def check_sizes(cls, cfg: Any, sizes: Sizes) -> None:
        """model.output=classes puts the training split's words in classes (data/clustering.py): at most one a word."""
        classes = cfg.model.get("classes")
        if output_of(cfg.model).word_classes and None not in (classes, sizes.words) and classes > sizes.words:
            raise NplmError(
                f"model.classes={classes} is more classes than the training split has distinct words "
                f"({sizes.words:,}): expected an integer from 2 to {sizes.words:,}"
            )

    @classmethod
    def fit_run(cls, cfg: Any, corpus: Corpus, logger: Any, job: Job) -> tuple[dict[str, float], Scores]:
        """Trained (or continued from the checkpoint a kill left), its best weights scored on every split."""
        return train_neural(cfg, corpus, logger, resume_from=job.resume_from())

    @classmethod
    def score_run(cls, run: Recorded, tokens: Tokens) -> np.ndarray:
        return score_splits(run.cfg, run.model(), tokens.corpus, [tokens.span])[tokens.span]

    @classmethod
    def reach(cls, run: Recorded) -> int | None:
        return run.model().score_reach

    @property
    def score_reach(self) -> int | None:
        """How many tokens before a token its score reads (`Family.reach`): the whole text, unless the family's model
        reads a window (eq. (1))."""
        return None

    @property
    def reads(self) -> Reading:
        """What it reads of a split (eq. (1): n-word windows; a stream model: rows or windows of the stream), whose
        batches data/module.py's CorpusData makes."""
        raise NotImplementedError

    def next_logprobs(self, contexts: list[list[int]]) -> torch.Tensor:
        """log P(next word | context), [len(contexts), |V|], float32; each context is ids in reading order."""
        raise NotImplementedError

    @property
    def context_needed(self) -> int:
        """How many tokens of context a question needs at least."""
        return 1

    def word_features(self) -> torch.Tensor:
        raise NotImplementedError

    @property
    def output_width(self) -> int:
        """The output layer's inputs a token: the width of its terms side by side."""
        raise NotImplementedError

    def flops_per_token(self, rows: float) -> float:
        """Forward FLOPs of one token (2 a multiply-add, counted from the layer shapes) when its output layer computes
        `rows` rows (|V| for the softmax; nplm-bench's FLOP ceilings); training is about three times that."""
        raise NotImplementedError

    def head(self, batch: Any, training: bool) -> Head:
        """What the output layer reads of `batch`: its scored tokens' targets and the layer's inputs (models/outputs.py);
        `training`: for a training step, else for scoring."""
        raise NotImplementedError

    def proposal_pairs(self, batches: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each training target and the word before it, from the training batches, for sampled training's proposal
        (None: batches it does not read)."""
        raise NotImplementedError

    def _token_nll(self, batch: Any) -> torch.Tensor:
        """-ln P of the batch's scored tokens, in the split's order, float32 from the exact distribution."""
        return self.layer.token_nll(self.head(batch, training=False))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        head = self.head(batch, training=True)
        loss = self.layer.loss(head)
        self._count(loss, len(head.target), batch_idx)
        return self._weighed(loss, len(head.target))

    def _weighed(self, loss: torch.Tensor, tokens: int) -> torch.Tensor:
        """The loss a step descends, from the batch's mean (a recipe may weigh a short batch less)."""
        return loss

    def on_train_start(self) -> None:
        """The run's output layer, now that the precision is resolved; sampled training's proposal first, counted on
        the training batches (each target, the word before it)."""
        if training_of(self.optim).sampled and (pairs := self.proposal_pairs(self.trainer.train_dataloader)):
            vocab = len(self.word_features())  # a row of input features a word
            self.proposal = Proposal(*pairs, vocab, self.optim["proposal"]).to(self.device)
        # SparseSGD keeps its word weights / their decay: a sampled step reads their rows through it
        sgd = next((o for o in self.trainer.optimizers if isinstance(o, SparseSGD)), None)
        self.layer = choose(self.classes, self.optim, self.trainer.precision, self.proposal, sgd.rows if sgd else None)

    def _output_layer(
        self, vocab_size: int, output: str, classes: int | None, widths: list[int], word_classes: torch.Tensor | None
    ) -> None:
        """model.output=classes: the class layer over outputs of `widths`, of `classes` classes, `word_classes` (the
        builder's `word_classes`; a checkpoint restores them without). The exact output layer until training picks
        the run's own (`on_train_start`)."""
        self.output = OUTPUTS[output]
        self.vocab_size = vocab_size
        if self.output.word_classes:
            self.classes = ClassOutput(vocab_size, classes or class_count(vocab_size), widths, word_classes)
        self.layer = choose(self.classes, {}, "32-true", None)

    def _count(self, loss: torch.Tensor, tokens: int, batch_idx: int) -> None:
        # Logged by hand, not by self.log(on_step, on_epoch) on every batch: that costs about 4% of a step.
        self._seen += tokens
        self._loss_sum += loss.detach() * tokens
        logged = batch_idx % self.trainer.log_every_n_steps == 0
        if logged or loss.device.type == "cpu":  # a GPU would wait for the check; a CPU's costs nothing
            self._check_finite(loss)
        if logged:
            self.log("train_loss_step", loss)

    def _check_finite(self, loss: torch.Tensor) -> None:
        """A loss past LOSS_LIMIT has diverged as surely as a NaN: its perplexity is no float64 number."""
        if not torch.isfinite(loss) or loss.item() > LOSS_LIMIT:
            raise NplmError(
                f"training loss is {loss.item():.4g} at epoch {self.current_epoch}, step {self.global_step}: {DIVERGED}"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The random generators' states, as the next epoch would start from them: dropout's masks and the sampled
        output layer's draws come from torch's global generator, so a run resumed from this checkpoint draws what
        the run that never stopped drew (Lightning's own checkpoints keep no generator state)."""
        checkpoint[RNG_KEY] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            checkpoint[RNG_KEY]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Kept until training starts (`on_train_epoch_start`): Lightning loads the checkpoint before its sanity
        check of validation, and a test that loads one trains nothing."""
        self._resumed_rng = checkpoint.get(RNG_KEY)

    def on_train_epoch_start(self) -> None:
        if (states := self._resumed_rng) is not None:
            torch.set_rng_state(states["cpu"])
            if "cuda" in states and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda"])
            self._resumed_rng = None
        batches = self.trainer.train_dataloader
        if hasattr(batches, "set_epoch"):  # epoch k's shuffle, also after a resume
            batches.set_epoch(self.current_epoch)
        self._on_device(batches)
        self._seen, self._epoch_start = 0, time.perf_counter()
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)

    def _on_device(self, loaders: object) -> None:
        """Move the batches' tokens to this module's device (a GPU) once, so no batch is copied from the host."""
        for batches in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
            if isinstance(batches, (WindowBatches, StreamBatches)):
                batches.to(self.device)

    def tokens_per_s(self) -> float:
        """The job's training tokens per second so far in this epoch: this process's, times the processes that read
        batches of their own (`readers`)."""
        return self._seen * self.readers / max(time.perf_counter() - self._epoch_start, 1e-9)

    @property
    def readers(self) -> int:
        """How many of the job's processes read training batches of their own: all of them (DDP's)."""
        return self.trainer.world_size

    def _settle(self) -> None:
        """Make the weights under lazy decay true (SparseSGD.settle)."""
        for optimizer in self._trainer.optimizers if self._trainer is not None else ():
            if isinstance(optimizer, SparseSGD):
                optimizer.settle()

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The true weights, lazy decay applied: what checkpoints and Models keep."""
        self._settle()
        return super().state_dict(*args, **kwargs)

    def on_train_end(self) -> None:
        self._settle()

    def on_train_epoch_end(self) -> None:
        mean = self._loss_sum / max(self._seen, 1)
        self._check_finite(mean)
        self.log("train_loss_epoch", mean)
        self.log("train_tokens_per_s", self.tokens_per_s())

    # Exact perplexity: validation_step scores the valid split each epoch; test_step scores any split,
    # dataloader i being SPLITS[i] (train, valid, test), for the reported checkpoint.
    @contextlib.contextmanager
    def _float32(self) -> Iterator[None]:
        """Evaluate in float32 even when training runs under bf16 autocast."""
        with torch.autocast(self.device.type, enabled=False):
            yield

    def _accumulate(self, batch: Any, slot: int) -> torch.Tensor:
        with self._float32():
            nll = self._token_nll(batch)
        self._nll[slot] += nll.double().sum()  # on the device: no wait for it per batch
        self._tokens[slot] += len(nll)
        return nll.detach()

    def _perplexity(self, slot: int) -> torch.Tensor:
        """A float64 tensor: a Python float would be logged as float32."""
        return torch.exp(self._nll[slot] / self._tokens[slot])

    def _reset(self) -> None:
        """New tensors, not zeroed ones: DDP's spawned processes would share the pickled ones' memory."""
        self._nll = torch.zeros(len(SPLITS), dtype=torch.float64, device=self.device)
        self._tokens = torch.zeros(len(SPLITS), dtype=torch.int64, device=self.device)

    def on_validation_epoch_start(self) -> None:
        self._settle()
        self._reset()
        self._on_device(self.trainer.val_dataloaders)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._accumulate(batch, SPLITS.index("valid"))

    def on_validation_epoch_end(self) -> None:
        perplexity = self._perplexity(SPLITS.index("valid"))
        if not self.trainer.sanity_checking and not torch.isfinite(perplexity):
            raise NplmError(
                f"validation perplexity is {perplexity.item()} after epoch {self.current_epoch + 1}: {DIVERGED}"
            )
        if not self.trainer.sanity_checking and perplexity.item() > FAR_ABOVE_UNIFORM * self.vocab_size:
            raise NplmError(
                f"validation perplexity is {perplexity.item():.3g} after epoch {self.current_epoch + 1}, over "
                f"{FAR_ABOVE_UNIFORM:g} times |V| = {self.vocab_size} (every word alike scores |V|): {DIVERGED}"
            )
        # sync_dist: under DDP every process scores the whole split, so the mean of theirs is that number
        self.log("valid_ppl_epoch", perplexity, prog_bar=True, sync_dist=True)

    def on_test_epoch_start(self) -> None:
        self._settle()
        self._reset()
        self._on_device(self.trainer.test_dataloaders)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Adds the batch to its split's perplexity; returns each token's -ln P, which `KeptScores` keeps."""
        return self._accumulate(batch, self._slots[dataloader_idx] if self._slots else dataloader_idx)

    def on_test_epoch_end(self) -> None:
        for slot, split in enumerate(SPLITS):
            if self._tokens[slot]:
                self.log(f"{split}_ppl", self._perplexity(slot), sync_dist=True)
                self.log(f"{split}_tokens", self._tokens[slot].double(), sync_dist=True)


def class_count(vocab_size: int) -> int:
    """model.classes=null: about sqrt(|V|) classes, which makes |classes| + |class size| smallest for equal sizes."""
    return max(2, round(math.sqrt(vocab_size)))


def word_classes(model: Any, corpus: Corpus) -> dict[str, Any]:
    """model.output=classes: the class of every word, by model.class_method on `corpus`'s training split
    (data/clustering.py), and how many classes that made (frequency bins may fill fewer): the constructor's
    `word_classes` and `classes`. Nothing for another output."""
    if not output_of(model).word_classes:
        return {}
    count = model.get("classes") or class_count(corpus.vocab_size)
    found = torch.from_numpy(output_classes(corpus, count, model.get("class_method", "exchange")))
    return {"word_classes": found, "classes": int(found.max()) + 1}
