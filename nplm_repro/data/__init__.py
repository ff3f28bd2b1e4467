"""Corpora in, token ids out: reading (Brown, plain text), vocabulary, splits, n-gram windows."""
