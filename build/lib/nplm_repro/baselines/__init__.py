"""The paper's comparison models: interpolated and back-off n-grams, class-based back-off, mixtures with the MLP."""
