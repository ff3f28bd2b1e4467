"""MLflow runs in, the paper's tables out: reading runs, choosing configurations, tables, renderings, figures, claims."""
