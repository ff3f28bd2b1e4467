"""Corpora in, token ids out: corpus.py (the Corpus type and what every reader shares), brown.py, text.py
(plain text and the AP preprocessing), load.py (the corpus a config names), splits.py, windows.py (n-gram windows)."""
