"""Class-based back-off n-gram, the "class-based back-off" rows of Table 1 (p. 1149).

    P(w_t | w_{t-n+1..t-1}) = P(k(w_t) | k(w_{t-n+1}), ..., k(w_{t-1})) * P(w_t | k(w_t))

- **Word classes k(w)** (Brown et al. 1992) are clustered on the training split by the exchange algorithm,
  cached per corpus fingerprint, c and passes (clustering.py).
- **The class n-gram** is the project's `ngram.KneserNey` (modified Kneser-Ney, SRILM's back-off) fitted on
  the class stream: a `Corpus` whose tokens are the classes of the word stream, same split bounds, so it
  is counted and scored exactly like the word models (every token a target, stream context, padded with
  the class of `<eot>` before the stream starts; that class is *named* `<eot>` for this reason).
  **Degenerate discounts**: Chen & Goodman's discounts need count-of-counts n1..n4 > 0, and at the class
  unigram level they are all 0 (every class follows hundreds of distinct classes), where SRILM's
  `ngram-count -kndiscount` stops with "one of required modified KneserNey count-of-counts is zero".
  Such an order takes the three discounts of the nearest higher order that has them (the class bigram
  level; KneserNey's `borrow_discounts`), which is recorded in `describe()` (`class_kn.1gram.discounts_from`).
- **P(w | class)** is the relative frequency of w among the training tokens of its class. Words never seen
  in training (794 on Brown: the vocabulary counts the whole stream) form one extra class `<unseen>`,
  uniform over its words. It never occurs in training, so the class n-gram gives it the class unigram's
  left-over mass (times the back-off weights), like any zeroton: the same probabilities as making each
  such word a zeroton class of its own, which is how SRILM treats LM vocabulary words in no class.
- The model is normalised over the vocabulary for any history: the class n-gram over the classes, and
  each class's word distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from nplm_repro.baselines.ngram import SRILM_MIN_COUNTS, KneserNey, NgramModel
from nplm_repro.data.clustering import METHODS, cluster_words
from nplm_repro.data.corpus import END_OF_TEXT, Corpus
from nplm_repro.data.splits import Sizes
from nplm_repro.errors import NplmError
from nplm_repro.rules import Rule, at_least, one_of

UNSEEN_CLASS = "<unseen>"


class ClassBackoff(NgramModel):
    """P(w | h) = P_KN(class(w) | classes of h) * P(w | class(w)); see the module docstring.

    n: order; c: number of classes of training words (plus `<unseen>` if some vocabulary words never occur
    in training); interpolate, min_counts: as ngram.KneserNey, for the class n-gram; method, max_passes:
    the clustering (exchange, passes until no word moves or max_passes); cache, cache_dir: the clustering
    cache (cache_dir None = $NPLM_CACHE or ~/.cache/nplm_repro).
    """

    family = "class_based"
    label = "class-based back-off"

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        return super().rules(cfg) | {
            "model.c": at_least(1),
            "model.method": one_of(*METHODS),
            "model.max_passes": at_least(0),
        }

    @classmethod
    def check_sizes(cls, cfg: Any, sizes: Sizes) -> None:
        """The classes are of the training split's words (data/clustering.py): at most one a word."""
        if sizes.words is not None and cfg.model.c > sizes.words:
            raise NplmError(
                f"model.c={cfg.model.c} is more classes than the training split has distinct words ({sizes.words:,}): "
                f"expected an integer from 1 to {sizes.words:,}"
            )

    def __init__(
        self,
        n: int = 3,
        c: int = 500,
        interpolate: bool = False,
        min_counts: Sequence[int] = SRILM_MIN_COUNTS,
        method: str = "exchange",
        max_passes: int = 100,
        cache: bool = True,
        cache_dir: str | None = None,
    ) -> None:
        if n < 2:
            raise NplmError(f"model.n={n}: a class-based back-off n-gram needs n >= 2")
        if c < 1:
            raise NplmError(f"model.c={c}: the number of classes must be >= 1")
        if method not in METHODS:
            raise NplmError(f"model.method={method!r} is not known (known: {', '.join(METHODS)})")
        if max_passes < 0:
            raise NplmError(f"model.max_passes={max_passes}: must be >= 0")
        self.order, self.c, self.interpolate, self.min_counts = n, c, interpolate, tuple(min_counts)
        self.method, self.max_passes, self.cache, self.cache_dir = method, max_passes, cache, cache_dir

    def fit(self, corpus: Corpus) -> ClassBackoff:
        self.clustering, self.cached = cluster_words(
            corpus, self.c, self.method, self.max_passes, self.cache, self.cache_dir
        )
        unseen = self.clustering.classes < 0
        self.unseen_words = int(unseen.sum())
        self.word_class = np.where(unseen, self.c, self.clustering.classes)  # [V] class of every word
        names = [f"class{k}" for k in range(self.c)] + ([UNSEEN_CLASS] if self.unseen_words else [])
        names[self.word_class[corpus.vocab.index(END_OF_TEXT)]] = END_OF_TEXT  # the stream's padding
        self.class_names = tuple(names)
        self.class_corpus = Corpus(
            f"{corpus.name}-classes",
            self.class_names,
            torch.from_numpy(self.word_class[corpus.ids.numpy()]),
            dict(corpus.bounds),
            dict(corpus.counts),
        )
        self.class_model = KneserNey(self.order, self.interpolate, self.min_counts, borrow_discounts=True)
        self.class_model.fit(self.class_corpus)
        self.discounts_from = self.class_model.discounts_from
        start, end = corpus.bounds["train"]
        words = np.bincount(corpus.ids[start:end].numpy(), minlength=corpus.vocab_size).astype(np.float64)
        per_class = np.bincount(self.word_class, weights=words, minlength=len(names))
        if self.unseen_words:  # uniform over <unseen>
            words[unseen] = 1.0
            per_class[self.c] = float(self.unseen_words)
        self.word_given_class = words / per_class[self.word_class]
        self.vocab_size, self.train_tokens = corpus.vocab_size, end - start
        self.fingerprint = corpus.fingerprint
        return self

    def class_rows(self, rows: np.ndarray) -> np.ndarray:
        """The windows with every word replaced by its class."""
        return self.word_class[rows]

    def window_probs(self, rows: np.ndarray) -> np.ndarray:
        return self.class_model.window_probs(self.class_rows(rows)) * self.word_given_class[rows[:, -1]]

    def describe(self) -> dict[str, object]:
        clustering = self.clustering
        per_token = self.train_tokens - 1  # bigrams of the training stream
        info: dict[str, object] = {
            "model": "class_based_" + ("interpolated" if self.interpolate else "backoff"),
            "order": self.order,
            "classes": self.c,
            "interpolate": self.interpolate,
            "min_counts": ",".join(map(str, self.class_model.min_counts)),
            "vocab_size": self.vocab_size,
            "train_tokens": self.train_tokens,
            "unseen_words": self.unseen_words,
            "clustering.method": clustering.method,
            "clustering.seconds": round(clustering.seconds, 2),
            "clustering.cpu_seconds": round(clustering.cpu_seconds, 2),
            "clustering.cached": self.cached,
            "clustering.passes": clustering.passes,
            "clustering.max_passes": self.max_passes,
            "clustering.converged": clustering.converged,
            "clustering.moves": " ".join(map(str, clustering.moves.tolist())),
            "clustering.train_bigram_ppl_start": float(np.exp(-clustering.log_likelihoods[0] / per_token)),
            "clustering.train_bigram_ppl": float(np.exp(-clustering.log_likelihoods[-1] / per_token)),
        }
        for level, stats in self.class_model.stats.items():
            for name, value in stats.items():
                info[f"class_kn.{level}gram.{name.replace('+', 'plus')}"] = value
        for level, source in self.discounts_from.items():
            info[f"class_kn.{level}gram.discounts_from"] = f"{source}gram"
        return {k: v.item() if isinstance(v, np.generic) else v for k, v in info.items()}
