"""A recorded run's score of every token, again: on a split of its data or on a user's text, for `nplm-score`, for a
mixed row whose MLP kept no scores, and to attach kept scores to runs made before runs kept them (`--log`).

The run is rebuilt from what it recorded, never from the caller's config: its `config.yaml` artifact, its data
(read again with its own reader and checked against its data fingerprint), and its model: a trained model (the MLP,
the LSTM, the Transformer) from its best checkpoint, an n-gram counted again (counting is deterministic), a mixed
row from the runs it mixes (an MLP and the trigram, or its study's rows) with the weights fitted again on validation
by the same EM. Its family scores it (`score_run`, nplm_repro/family.py), through the code path of the run's own
evaluation; `RunScorer` is what a family reads of the run (the contract's `Recorded`).
"""

from __future__ import annotations

import difflib
import gc
import json
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import mlflow
import numpy as np
import torch
from hydra.utils import get_class
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf

from nplm_repro.baselines.mixture import StoredMixedRow
from nplm_repro.baselines.ngram import split_windows
from nplm_repro.data.corpus import END_OF_PARAGRAPH, END_OF_TEXT, UNK, Corpus
from nplm_repro.data.load import corpus_kind, load_corpus
from nplm_repro.data.plain import read_context, text_pieces
from nplm_repro.errors import NplmError
from nplm_repro.family import Family, family_of
from nplm_repro.migrations import CHECKPOINT_BEFORE_MODELS
from nplm_repro.models.language_module import LanguageModule
from nplm_repro.scores import KEPT_SPLITS, Scores
from nplm_repro.serving.served import model_of
from nplm_repro.storage.kept import artifacts, download, kept_scores
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import store_error, tracking_at

RUN_ID = re.compile(r"[0-9a-f]{32}")  # what MLflow's stores name a run: uuid4().hex
T = TypeVar("T")


def check_run_id(run_id: str) -> None:
    """Refuse what cannot be a run id (a path, a run's name, a truncated id) before the store is asked, which would
    answer with an error about itself."""
    if not RUN_ID.fullmatch(run_id):
        raise NplmError(f"{run_id!r} is not a run id: MLflow's run ids are 32 lowercase hex digits")


def has_weights(client: mlflow.MlflowClient, run_id: str) -> bool:
    """Whether a trained run's weights can be loaded: its Model, or the checkpoint of a run from before Models."""
    return model_of(client, run_id) is not None or CHECKPOINT_BEFORE_MODELS in artifacts(client, run_id, "checkpoints")


TEXT = "text"  # the span a user's text takes in the corpus built around it
PART_TOKENS = 1 << 20  # a long text is scored in parts of this many tokens (`RunScorer.text`), each about 50 MB


@dataclass
class Tokens:
    """What is scored: a span of a corpus (a split, or a user's text in a corpus of its own), as counted; for a
    user's text also its words outside the run's vocabulary (a split's are not kept: its data holds ids)."""

    corpus: Corpus
    span: str
    unk: int = 0
    texts: int = 0
    unknown: Counter = field(default_factory=Counter)

    @classmethod
    def of_split(cls, corpus: Corpus, split: str) -> Tokens:
        start, end = corpus.bounds[split]
        ids = corpus.ids[start:end]
        texts = len(np.unique(corpus.text_ids(split)))
        return cls(corpus, split, int((ids == corpus.vocab.index(UNK)).sum()), texts)

    @property
    def size(self) -> int:
        return self.corpus.size(self.span)

    def text_ids(self) -> np.ndarray:
        return self.corpus.text_ids(self.span)

    def rows(self, order: int) -> np.ndarray:
        return split_windows(self.corpus, self.span, order)


class RunScorer:
    """One FINISHED run of the store, rebuilt to score tokens as it scored its own."""

    def __init__(self, uri: str, run_id: str, data_path: str | None = None, corpus: Corpus | None = None) -> None:
        """`corpus`: the run's data already read (a mixed row's, for its MLP), used if its fingerprint is the run's."""
        check_run_id(run_id)
        self.uri, self.client = uri, mlflow.MlflowClient(uri)
        try:
            self.run = self.client.get_run(run_id)
        except MlflowException as error:
            if "not found" in str(error).lower() or "RESOURCE_DOES_NOT_EXIST" in str(error):
                raise NplmError(f"no run {run_id} in the store at {redact(uri)}") from None
            raise NplmError(f"the store at {redact(uri)} did not answer: {redact(store_error(error))}") from None
        self.run_id, tags = run_id, self.run.data.tags
        if "data_fingerprint" not in tags:
            raise NplmError(f"run {run_id} is not an nplm-repro run (it has no data_fingerprint tag)")
        if self.run.info.status != "FINISHED":
            raise NplmError(f"run {run_id} is {self.run.info.status}, not FINISHED: only a finished run is scored")
        self.cfg = self._config()
        reuse = corpus is not None and corpus.fingerprint == tags["data_fingerprint"]
        self.corpus = corpus if reuse else self._corpus(data_path)
        self._module: LanguageModule | None = None
        self._parts: list[RunScorer] | None = None
        self._made: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self.run.data.tags.get("mlflow.runName", self.run_id)

    @property
    def family(self) -> type[Family]:
        """The family that scores the run: its config's; for a trained family's run of kind mixed (an MLP's
        `model.mix`, stored before mixtures were rows of their own), the mixture module's `StoredMixedRow`."""
        family = family_of(self.cfg.model)
        return StoredMixedRow if family.trained and family.kind(self.cfg) == "mixed" else family

    @property
    def kind(self) -> str:
        """trained (weights), counted (an n-gram) or mixed (other runs' scores): its family says."""
        return self.family.kind(self.cfg)

    def _config(self) -> DictConfig:
        if "config.yaml" not in artifacts(self.client, self.run_id):
            raise NplmError(f"run {self.run_id} has no config.yaml artifact: it cannot be rebuilt")
        with tempfile.TemporaryDirectory() as into:
            return OmegaConf.load(download(self.client, self.run_id, "config.yaml", into))

    def _corpus(self, data_path: str | None) -> Corpus:
        """The run's data, read again; from `data_path`, else the path its config gives, else the one its dataset
        input recorded (an absolute path), and refused unless its fingerprint is the run's."""
        candidates = [data_path] if data_path else [self.cfg.data.get("path"), *self._recorded_sources()]
        data, kind = self.cfg.data, corpus_kind(self.cfg.data)
        found = next((p for p in candidates if p and Path(p).expanduser().exists()), None)
        if found is None and kind.without_path is None:
            tried = ", ".join(str(p) for p in candidates if p) or "none recorded"
            raise NplmError(f"the data of run {self.run_id} is not found (tried {tried}): pass --data-path")
        data = OmegaConf.merge(data, {"path": found}) if found else data
        corpus = load_corpus(data)
        expected = self.run.data.tags["data_fingerprint"]
        if corpus.fingerprint != expected:
            raise NplmError(
                f"the data read from {found or kind.without_path} has fingerprint {corpus.fingerprint}, run "
                f"{self.run_id}'s is {expected}: pass --data-path with the run's own corpus"
            )
        return corpus

    def _recorded_sources(self) -> list[str]:
        sources = []
        for found in self.run.inputs.dataset_inputs if self.run.inputs else []:
            try:
                sources.append(json.loads(found.dataset.source)["uri"])
            except (ValueError, KeyError, TypeError):
                continue
        return sources

    def split(self, split: str) -> Tokens:
        if split not in self.corpus.bounds:
            raise NplmError(f"--split {split}: the run's data has the splits {', '.join(self.corpus.bounds)}")
        return Tokens.of_split(self.corpus, split)

    def words(self, text: str) -> list[int]:
        """The ids of a short text (a prompt), read as `text` reads a file, without the marks of its end; a word
        outside the run's vocabulary is an error naming it and its closest spellings."""
        words = read_context(text, self.cfg.data, "the prompt")
        index = {w: i for i, w in enumerate(self.corpus.vocab)}
        for word in words:
            if word not in index:
                close = difflib.get_close_matches(word, self.corpus.vocab, n=3)
                hint = f"; closest: {', '.join(close)}" if close else ""
                raise NplmError(f"{word!r} is not in the run's vocabulary ({len(index):,} words){hint}")
        return [index[w] for w in words]

    def text(
        self, path: Path, tokenized: bool = False, encoding: str | None = None, part: int = PART_TOKENS
    ) -> Iterator[Tokens]:
        """A user's text file, read as the run reads its corpus (plain.py's `read_text`; `tokenized`: its
        whitespace-separated tokens as they are), its words outside the run's vocabulary as `<unk>`, in parts of
        `part` tokens: each a corpus of its own over the run's vocabulary, the part its one span, the `reach`
        tokens before it in front, so that every token scores as in the whole text while the memory taken does not
        grow with the file. A family whose score reads the whole text before a token (`reach` None: an LSTM, a
        Transformer) takes it in one part. A file that is no text, or has no words, is refused: it would be scored
        as a text of only its end marks. `encoding`: the file's (`--encoding`); else the one its byte-order mark
        says (UTF-8, UTF-16, UTF-32: `text_encoding`), else the run's corpus's."""
        name = f"--text {path}"
        index = {w: i for i, w in enumerate(self.corpus.vocab)}
        unk = index[UNK]
        reach = self.reach()
        part = max(part, reach + 1) if reach is not None else sys.maxsize
        held, before, unknown, words = [], np.empty(0, np.int64), Counter(), 0

        def scored(ids: np.ndarray) -> Tokens:
            stream = torch.from_numpy(np.concatenate([before, ids]))
            bounds = {TEXT: (len(before), len(stream))}
            corpus = Corpus(self.corpus.name, self.corpus.vocab, stream, bounds, texts=(path.name,))
            return Tokens(corpus, TEXT, int((ids == unk).sum()), 1, unknown)

        try:
            for piece in text_pieces(path, self.cfg.data, name, tokenized, encoding):
                held.append(np.fromiter((index.get(w, unk) for w in piece), np.int64, len(piece)))
                unknown.update(w for w in piece if w not in index)
                words += sum(w not in (END_OF_PARAGRAPH, END_OF_TEXT) for w in piece)
                while sum(map(len, held)) > part and words:  # a part is scored once the text has words
                    ids = np.concatenate(held)
                    yield scored(ids[:part])
                    before, held, unknown = ids[part - (reach or 0) : part], [ids[part:]], Counter()
                    gc.collect()  # the part's Trainer and arrays: few objects in cycles, that no count would collect
        except OSError as error:
            raise NplmError(f"{name}: cannot read ({error.strerror or error})") from None
        if not words:
            raise NplmError(f"{name}: no words in it (an empty or blank file): nothing to score")
        yield scored(np.concatenate(held))

    def reach(self) -> int | None:
        return self.family.reach(self)

    def logprob(self, tokens: Tokens) -> np.ndarray:
        """ln P of every token, as the run's family scores a recorded run (`score_run`): float64 from a count or a
        mixture, float32 values from a trained model's exact softmax."""
        return self.family.score_run(self, tokens)

    def kept(self) -> Scores:
        """The run's scores of valid and test, as runs now keep them."""
        logprobs = {split: self.logprob(self.split(split)) for split in KEPT_SPLITS}
        return Scores.of(self.corpus.text_names(), logprobs, {s: self.corpus.text_ids(s) for s in KEPT_SPLITS})

    def model(self) -> LanguageModule:
        """The trained model's best weights: its Model's checkpoint, or the checkpoint artifact of a run from before
        runs logged a Model (an adopted run's weights are those of the run it adopted)."""
        if self._module is None:
            source = self.run.data.tags.get("adopted_from", self.run_id)
            model = model_of(self.client, source)
            if model is None and CHECKPOINT_BEFORE_MODELS not in artifacts(self.client, source, "checkpoints"):
                raise NplmError(
                    f"run {source} has no weights, neither a Model nor {CHECKPOINT_BEFORE_MODELS} (it stopped before "
                    "its first validation, or they were deleted)"
                )
            with tempfile.TemporaryDirectory() as into:
                if model is None:
                    path = download(self.client, source, CHECKPOINT_BEFORE_MODELS, into)
                else:
                    with tracking_at(self.uri):  # models:/ resolves through the global tracking URI
                        folder = mlflow.artifacts.download_artifacts(f"models:/{model}", dst_path=into)
                    path = str(next((Path(folder) / "artifacts").glob("*.ckpt")))
                try:
                    module = get_class(self.cfg.model._target_)
                    self._module = module.load_from_checkpoint(path, map_location="cpu")
                except (OSError, RuntimeError, EOFError) as error:
                    raise NplmError(f"the weights of run {source} are unreadable: {error}") from None
            self._module.eval()
        return self._module

    def memo(self, key: str, make: Callable[[], T]) -> T:
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def kept_logprob(self, split: str) -> np.ndarray:
        kept = kept_scores(self.client, self.run_id)
        return kept.splits[split].logprob if kept else self.logprob(self.split(split))

    def parts(self) -> list[RunScorer]:
        """The runs it was made from (tag base_run_id: their ids, in the order its family needs them: a mixture's
        components), rebuilt on its data."""
        if self._parts is None:
            ids = [run for run in self.run.data.tags.get("base_run_id", "").split(",") if run]
            if not ids:
                raise NplmError(f"mixed run {self.run_id} does not name the runs it mixes (tag base_run_id)")
            self._parts = [RunScorer(self.uri, run, corpus=self.corpus) for run in ids]
        return self._parts
