"""What an MLP run's word features learned, as artifacts of the run (`features/`), for the dashboard and the report:

- `neighbours.md`: the nearest words (centred cosine similarity of C's rows) of probe words, among words seen at least
  50 times in training: frequent words of several kinds and the paper's own example words (p.1139), those seen as
  often;
- `map.png`: the most frequent words laid out on the first two principal components of their rows of C, drawn from
  `map.json`, its points (serving/feature_map.py), which a study's archive ships;
- `sentences.md`: the paper's motivating example (p.1139), "The cat is walking in the bedroom" and "A dog was running
  in a room": P of each word given the words before it (a sentence starts as a text does, after `<eot>`), under
  this MLP and under the interpolated trigram (Del. Int.) counted on the same training split.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch

from nplm_repro.baselines.ngram import DeletedInterpolation
from nplm_repro.data.corpus import END_OF_PARAGRAPH, END_OF_TEXT, UNK, Corpus
from nplm_repro.models.language_module import LanguageModule
from nplm_repro.models.use import nearest
from nplm_repro.perplexity import perplexity_of
from nplm_repro.serving.feature_map import MAP_WORDS, draw, map_points

FOLDER = "features"
PROBES = (
    *("the", "a", "of", "in", "and", "is", "was", "he", "she", "they", "said", "made", "good", "new", "two", "three"),
    *("man", "city", "government", "money", "house", "Monday", "John", "cat", "dog", "room", "bedroom"),
    *("walking", "running"),
)
SENTENCES = ("The cat is walking in the bedroom", "A dog was running in a room")
MARKS = (UNK, END_OF_PARAGRAPH, END_OF_TEXT)
MIN_COUNT = 50  # training occurrences a word needs to be listed as a probe or a neighbour


def neighbours(module: LanguageModule, corpus: Corpus, k: int = 10) -> list[str]:
    """One line per probe word seen at least MIN_COUNT times in training: its k nearest words among those seen as
    often, by centred cosine similarity (`nearest`); a rarer word's features are too seldom trained to say anything."""
    start, end = corpus.bounds["train"]
    seen = torch.bincount(corpus.ids[start:end], minlength=corpus.vocab_size) >= MIN_COUNT
    present = [w for w in PROBES if w in corpus.vocab and seen[corpus.vocab.index(w)]]
    found = nearest(module.word_features(), [corpus.vocab.index(w) for w in present], k, among=seen)
    return [f"{w}: " + ", ".join(f"{corpus.vocab[i]} {s:.2f}" for i, s in near) for w, near in zip(present, found)]


def map_of(module: LanguageModule, corpus: Corpus, title: str) -> dict[str, Any]:
    """The map's points (serving/feature_map.py): the MAP_WORDS most frequent words of the training split (no
    markers) on C's first two principal components."""
    start, end = corpus.bounds["train"]
    counts = np.bincount(corpus.ids[start:end].numpy(), minlength=corpus.vocab_size)
    marks = [corpus.vocab.index(m) for m in MARKS if m in corpus.vocab]
    counts[marks] = -1
    words = np.argsort(-counts, kind="stable")[:MAP_WORDS]
    rows = module.word_features().double().numpy()[words]
    return map_points(rows, [corpus.vocab[i] for i in words], title)


def sentences(module: LanguageModule, corpus: Corpus) -> list[str]:
    """The paper's two sentences: per word, P under the model and under Del. Int.; then both sentences' perplexities.
    Each sentence follows `<eot>`, as a text starts."""
    index = {w: i for i, w in enumerate(corpus.vocab)}
    eot, unk, need = index[END_OF_TEXT], index[UNK], max(module.context_needed, 2)
    trigram = DeletedInterpolation().fit(corpus)
    name = module.label
    lines = []
    for sentence in SENTENCES:
        words = sentence.split()
        ids = [eot] * need + [index.get(w, unk) for w in words]
        with torch.no_grad():
            logp = module.next_logprobs([ids[:t] for t in range(need, len(ids))]).double()
        model = logp.gather(1, torch.tensor(ids[need:])[:, None])[:, 0].exp().numpy()
        counted = trigram.window_probs(np.array([ids[t - 2 : t + 1] for t in range(need, len(ids))]))
        cells = [
            f"{w}{' (<unk>)' if w not in index else ''} {p:.3g} / {q:.3g}" for w, p, q in zip(words, model, counted)
        ]
        ppl = [perplexity_of(p) for p in (model, counted)]
        lines.append(f"{sentence}: P(word | before) {name} / Del. Int.: {'; '.join(cells)}")
        lines.append(f"{sentence}: perplexity {name} {ppl[0]:.1f}, Del. Int. {ppl[1]:.1f}")
    return lines


def log_features(client: mlflow.MlflowClient, run_id: str, module: LanguageModule, corpus: Corpus, title: str) -> None:
    """The run's `features/` artifacts (module docstring), from its best weights `module`."""
    module.eval()
    with tempfile.TemporaryDirectory(prefix="nplm-features-") as tmp:
        folder = Path(tmp)
        near = "\n".join(f"- {line}" for line in neighbours(module, corpus))
        (folder / "neighbours.md").write_text(
            f"# {title}: nearest words by word features (centred cosine similarity, words seen {MIN_COUNT}+ times)\n\n"
            f"{near}\n"
        )
        said = "\n".join(f"- {line}" for line in sentences(module, corpus))
        (folder / "sentences.md").write_text(f"# {title}: the paper's example sentences\n\n{said}\n")
        points = map_of(module, corpus, title)
        (folder / "map.json").write_text(json.dumps(points, sort_keys=True), encoding="utf-8")
        (folder / "map.png").write_bytes(draw(points))
        client.log_artifacts(run_id, str(folder), FOLDER)
