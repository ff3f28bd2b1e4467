"""Corpora in, token ids out, one way: files.py (a folder's or a zip's files) -> tokens.py (the stream, its
paragraphs and marks) -> splits.py -> vocabulary.py -> corpus.py (the Corpus); brown.py and text.py (plain text
and the AP preprocessing) are the readers that go down those steps; load.py holds the corpus kinds (what a caller
asks of one) and picks the one a config names; plain.py reads a user's text as a run reads its corpus (brown_plain.py
cuts it as Brown is cut); windows.py and streams.py are what a family reads of a split."""
