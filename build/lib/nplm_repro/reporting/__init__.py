"""MLflow runs in, the paper's tables out: runs (reading), tables (the Report), notes and claims (what the
numbers say), render and figures (the files)."""
