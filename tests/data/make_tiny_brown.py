"""Write tests/data/tiny_brown.zip: a small synthetic corpus laid out as NLTK's brown.zip (not the Brown corpus).

The zip holds `brown/` with texts named as Brown's (c[a-r]NN) in Brown's Form C: `word/tag` items, a tab before a
paragraph's first line, one sentence a line, paragraphs apart by blank lines; and README, CONTENTS and cats.txt,
which the reader skips. About 10,000 words, seeded and deterministic:

- a Zipf-like vocabulary (function words first, then made-up content words), so that most types are seen
  3 times or fewer and max_unk_freq=3 maps them to <unk>;
- stock phrases repeated at several rates, so that n-grams up to order 5 occur 1, 2, 3, 4 and more times
  (modified Kneser-Ney needs its count-of-counts n1..n4 > 0 at every order);
- topic words used only within one text, so that a later text brings words never seen in training.

Run `python tests/data/make_tiny_brown.py` to write it again (`--out` elsewhere); tests/test_corpus.py checks
that the committed zip holds what this script writes.
"""

from __future__ import annotations

import argparse
import random
import zipfile
from pathlib import Path

SEED = 2003
OUT = Path(__file__).resolve().parent / "tiny_brown.zip"
TEXTS = {  # name -> Brown's category of that letter
    "ca01": "news",
    "ca02": "news",
    "ca03": "news",
    "ca04": "news",
    "cb01": "editorial",
    "cb02": "editorial",
    "cc01": "reviews",
    "cd01": "religion",
    "ce01": "hobbies",
    "ce02": "hobbies",
    "cf01": "lore",
    "cg01": "belles_lettres",
    "ch01": "government",
    "cj01": "learned",
    "cj02": "learned",
    "ck01": "fiction",
    "cl01": "mystery",
    "cm01": "science_fiction",
    "cn01": "adventure",
    "cp01": "romance",
    "cr01": "humor",
}
WORDS_PER_TEXT = 480
FUNCTION_WORDS = [  # (word, tag), most frequent first, as in Brown
    ("the", "at"),
    (",", ","),
    ("of", "in"),
    ("and", "cc"),
    ("to", "to"),
    ("a", "at"),
    ("in", "in"),
    ("that", "cs"),
    ("is", "bez"),
    ("was", "bedz"),
    ("he", "pps"),
    ("for", "in"),
    ("it", "pps"),
    ("with", "in"),
    ("as", "cs"),
    ("his", "pp$"),
    ("on", "in"),
    ("be", "be"),
    ("at", "in"),
    ("by", "in"),
    ("I", "ppss"),
    ("this", "dt"),
    ("had", "hvd"),
    ("not", "*"),
    ("are", "ber"),
    ("but", "cc"),
    ("from", "in"),
    ("or", "cc"),
    ("have", "hv"),
    ("an", "at"),
    ("they", "ppss"),
    ("which", "wdt"),
    ("one", "cd"),
    ("you", "ppss"),
    ("were", "bed"),
    ("her", "pp$"),
    ("all", "abn"),
    ("she", "pps"),
    ("there", "ex"),
    ("would", "md"),
]
TAGS = ["nn"] * 9 + ["vb"] * 4 + ["jj"] * 3 + ["np"] * 2 + ["nns"] + ["rb"]
ONSETS = ["b", "br", "c", "ch", "d", "dr", "f", "g", "gl", "h", "j", "k", "l", "m", "n", "p", "pl", "r", "s", "st"]
ONSETS += ["t", "tr", "v", "w"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
CONTENT_WORDS = 1400
PHRASES = 40
TOPIC_WORDS = 8


def made_up_words(rng: random.Random, how_many: int) -> list[tuple[str, str]]:
    """Distinct pronounceable words with a tag each; proper nouns (np) capitalised."""
    seen = {w.lower() for w, _ in FUNCTION_WORDS}
    words = []
    while len(words) < how_many:
        word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(rng.randint(1, 3)))
        if word in seen:
            continue
        seen.add(word)
        tag = rng.choice(TAGS)
        words.append((word.capitalize() if tag == "np" else word, tag))
    return words


def zipf_weights(size: int, exponent: float = 1.05, shift: float = 1.5) -> list[float]:
    return [1 / (rank + shift) ** exponent for rank in range(size)]


def texts(seed: int = SEED) -> dict[str, str]:
    """Each text's file content, by member name (brown/ca01, ...)."""
    rng = random.Random(seed)
    vocab = FUNCTION_WORDS + made_up_words(rng, CONTENT_WORDS)
    weights = zipf_weights(len(vocab))
    # stock phrases of 4 to 7 words, used at Zipf-like rates: their n-grams repeat a few to many times
    phrases = [rng.choices(vocab[:400], weights[:400], k=rng.randint(4, 7)) for _ in range(PHRASES)]
    phrase_weights = zipf_weights(PHRASES, exponent=1.0, shift=1.0)
    tail = list(range(300, len(vocab)))
    rng.shuffle(tail)
    files = {}
    for number, name in enumerate(TEXTS):
        topic = [vocab[i] for i in tail[number * TOPIC_WORDS : (number + 1) * TOPIC_WORDS]]
        words, paragraphs = 0, []
        while words < WORDS_PER_TEXT:
            lines = []
            for _ in range(rng.randint(1, 5)):
                sentence: list[tuple[str, str]] = []
                for _ in range(rng.randint(5, 20)):
                    draw = rng.random()
                    if draw < 0.07:
                        sentence += rng.choices(phrases, phrase_weights)[0]
                    elif draw < 0.15:
                        sentence.append(rng.choice(topic))
                    else:
                        sentence.append(rng.choices(vocab, weights)[0])
                first, tag = sentence[0]
                sentence[0] = (first[0].upper() + first[1:], tag)
                sentence.append(rng.choice([(".", ".")] * 8 + [("?", "."), ("!", ".")]))
                words += len(sentence)
                lines.append(" ".join(f"{w}/{t}" for w, t in sentence))
            paragraphs.append("\t" + "\n".join(lines))
        files[f"brown/{name}"] = "\n\n" + "\n\n\n".join(paragraphs) + "\n\n"
    return files


def others() -> dict[str, str]:
    """The members of brown.zip that are not texts."""
    readme = "TINY BROWN\n\nA synthetic corpus in the layout of NLTK's brown.zip, written by\n"
    readme += "tests/data/make_tiny_brown.py for the tests. Not the Brown corpus: made-up words.\n"
    contents = "CONTENTS\n\nEach filename is a 'c', a category letter a-r and a number, as in Brown.\n"
    cats = "".join(f"{name} {category}\n" for name, category in TEXTS.items())
    return {"brown/CONTENTS": contents, "brown/README": readme, "brown/cats.txt": cats}


def write(path: Path, seed: int = SEED) -> Path:
    """The zip, byte for byte the same on every run (fixed member order, times and modes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        folder = zipfile.ZipInfo("brown/", date_time=(2008, 12, 3, 4, 12, 0))
        folder.external_attr = (0o40755 << 16) | 0x10
        archive.writestr(folder, b"")
        for name, content in {**texts(seed), **others()}.items():
            member = zipfile.ZipInfo(name, date_time=(2008, 12, 3, 4, 12, 0))
            member.external_attr = 0o644 << 16
            member.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(member, content.encode("utf-8"))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write the zip (default: {OUT})")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    written = write(args.out, args.seed)
    items = [item for text in texts(args.seed).values() for item in text.split()]
    print(f"wrote {written}: {len(TEXTS)} texts, {len(items):,} words, {len(set(items)):,} word/tag types")


if __name__ == "__main__":
    main()
