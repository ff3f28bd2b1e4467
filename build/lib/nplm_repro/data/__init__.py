"""Corpora in, token ids out, one way: files.py (a folder's or a zip's files) -> tokens.py (the stream, its
paragraphs and marks) -> splits.py -> vocabulary.py -> corpus.py (the Corpus); brown.py and text.py (plain text
and the AP preprocessing) are the readers that go down those steps, load.py picks the one a config names;
windows.py (n-gram windows)."""
