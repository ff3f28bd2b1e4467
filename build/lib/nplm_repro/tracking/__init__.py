"""The run ledger in MLflow: what identifies a run, where runs are stored, what each records, skip / resume, sweeps."""
