"""What a trained model is asked besides a score: text continued from a prompt, and the nearest words by its
word features (eq. (1)'s C, an LSTM's or a Transformer's input embedding).

Both work on ids of the run's vocabulary; `nplm-ask` (nplm_repro/ask.py) turns words into ids and back.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from nplm_repro.models.language_module import LanguageModule


@torch.no_grad()
def continue_ids(
    module: LanguageModule,
    prompt: list[int],
    words: int,
    temperature: float,
    seed: int,
    pad: int,
    never: tuple[int, ...] = (),
) -> list[int]:
    """`words` ids drawn one at a time from P(w_t | the ids before it) (as much of them as the model reads), each
    distribution's log-probabilities divided by `temperature` (0: the most probable word every time); the same for
    the same seed. A prompt shorter than the model needs is padded on the left with `pad` (`<eot>`: as if a text had
    just ended, as the stream starts). The ids in `never` (say `<unk>`) are never drawn."""
    generator = torch.Generator().manual_seed(seed)
    ids = [pad] * max(0, module.context_needed - len(prompt)) + list(prompt)
    for _ in range(words):
        logp = module.next_logprobs([ids])[0]
        if never:
            logp[list(never)] = -torch.inf
        if temperature == 0:
            ids.append(int(logp.argmax()))
        else:
            ids.append(int(torch.multinomial(F.softmax(logp / temperature, dim=-1), 1, generator=generator)))
    return ids[len(ids) - words :]


@torch.no_grad()
def nearest(
    features: torch.Tensor, ids: list[int], k: int, among: torch.Tensor | None = None
) -> list[list[tuple[int, float]]]:
    """For each id, the k other ids whose rows of C are nearest by centred cosine similarity (the rows' mean vector
    removed first), with that similarity; only ids where `among` (a bool per row) is true are candidates.

    Centring matters: rare words' rows, seldom updated, collapse onto one shared direction (representation
    degeneration, Gao et al. 2019), so raw cosines of 0.95 between "cat" and "coroner" say nothing of meaning."""
    rows = features.float()
    centre = (rows[among] if among is not None else rows).mean(dim=0)
    unit = F.normalize(rows - centre, dim=1)
    similarity = unit[ids] @ unit.T
    similarity[torch.arange(len(ids)), ids] = -torch.inf  # a word is not its own neighbour
    if among is not None:
        similarity[:, ~among] = -torch.inf
    values, found = similarity.topk(k, dim=1)
    return [list(zip(row.tolist(), value.tolist())) for row, value in zip(found, values)]
