"""Every trained run as an MLflow Model (MLflow 3's logged model, linked to its run): a pyfunc that answers
the next-word distribution of a context, loadable with `mlflow.pyfunc.load_model("runs:/<run id>/model")`,
registrable, and servable with `mlflow models serve`.

The Model carries what it needs to answer without the training data: the best checkpoint (the run's weights, logged
once: the run keeps no other copy), the vocabulary with the run's reader settings, and this package's code
(`code_paths`), so a fresh Python process with the project's requirements loads it without importing anything of
ours by hand. Its requirements are the project's own, torch as a range, so the build already installed (CPU or
GPU) is kept.

Input: a DataFrame, one context per row: `context`, a text read with the run's own reader, of which the last n-1
tokens are the context (fewer is an error); optionally `next_word`, whose log-probability is returned. Params: `k`,
how many of the most probable next words to return (default 10). Output: per row `words` and `probs` (the k most
probable, most probable first) and `logprob` (of `next_word`, a word outside the vocabulary scored as `<unk>`;
None, JSON's null, without one).
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.entities import LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature, infer_signature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.types import ColSpec, DataType, Schema
from omegaconf import DictConfig, OmegaConf

from nplm_repro.data.corpus import UNK, Corpus
from nplm_repro.errors import NplmError
from nplm_repro.migrations import upgrade_reading

MODEL = "model"  # the logged model's name: runs:/<run id>/model
WEIGHTS = "weights"  # the artifact key of the checkpoint inside the Model
READING = "reading"  # the artifact key of the vocabulary, the reader settings and the module's class
EXAMPLE = pd.DataFrame(
    {"context": ["The Fulton County Grand Jury said Friday that an investigation of"], "next_word": ["the"]}
)


def _refuse(message: str) -> MlflowException:
    """An error a scoring server answers with 400 (bad request), not 500."""
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


class NextWords(mlflow.pyfunc.PythonModel):
    """The pyfunc of a trained run: P(next word | a context) from the model's exact softmax (eq. (1) reads the last
    n-1 tokens; an LSTM or a Transformer all of them, up to its window)."""

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        from hydra.utils import get_class

        reading = upgrade_reading(json.loads(Path(context.artifacts[READING]).read_text()))
        module = get_class(reading["module"])
        self.module = module.load_from_checkpoint(context.artifacts[WEIGHTS], map_location="cpu").eval()
        self.vocab: list[str] = reading["vocab"]
        self.data = OmegaConf.create(reading["data"])
        self.index = {w: i for i, w in enumerate(self.vocab)}

    def tokens(self, text: object) -> list[str]:
        """A context's tokens, read as the run read its corpus (plain.py's `read_context`); a context that is no
        text is a bad request."""
        from nplm_repro.data.plain import read_context

        if not isinstance(text, str):
            raise _refuse(f"a context must be a string, not {type(text).__name__}: {text!r}")
        try:
            return read_context(text, self.data, "the context")
        except NplmError as error:
            raise _refuse(str(error)) from None

    def predict(
        self, context: mlflow.pyfunc.PythonModelContext, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        import torch

        if "context" not in model_input:
            raise _refuse(f"the input needs a column 'context' (it has: {', '.join(map(str, model_input.columns))})")
        k = int((params or {}).get("k", 10))
        if not 1 <= k <= len(self.vocab):
            raise _refuse(f"k={k}: between 1 and the vocabulary's {len(self.vocab):,} words")
        need = self.module.context_needed
        unk = self.index[UNK]
        rows = []
        for text in model_input["context"]:
            words = self.tokens(text)
            if len(words) < need:
                raise _refuse(f"context {text!r} has {len(words)} tokens: this model reads at least {need}")
            rows.append([self.index.get(w, unk) for w in words])
        with torch.no_grad():
            logp = self.module.next_logprobs(rows).double()
        top = logp.topk(k, dim=1)
        nexts = model_input["next_word"] if "next_word" in model_input else [None] * len(rows)
        asked = [  # None (JSON's null) where no next word was asked: NaN is no JSON
            None if not isinstance(w, str) else float(logp[i, self.index.get(w, unk)]) for i, w in enumerate(nexts)
        ]
        return pd.DataFrame(
            {
                "words": [[self.vocab[j] for j in row] for row in top.indices.tolist()],
                "probs": [list(np.exp(row)) for row in top.values.tolist()],
                "logprob": pd.Series(asked, dtype=object if None in asked else float),
            }
        )


def requirements() -> list[str]:
    """The project's own requirements (torch a range: the installed build, CPU or GPU, satisfies it)."""
    found = importlib.metadata.requires("nplm-repro") or []
    return [r for r in found if "extra ==" not in r]


def _code(folder: Path) -> Path:
    """This package's code, less caches, as the Model's code path."""
    source = Path(__file__).resolve().parents[1]
    return Path(shutil.copytree(source, folder / "nplm_repro", ignore=shutil.ignore_patterns("__pycache__")))


def log_model(
    client: mlflow.MlflowClient, run_id: str, checkpoint: Path, corpus: Corpus, data: DictConfig, module: str
) -> str:
    """Log the trained model of `run_id` (its best checkpoint, of the LightningModule class `module` names, read with
    `corpus`'s vocabulary and the reader settings of `data`) as the run's Model; returns the logged model's id."""
    run = client.get_run(run_id)
    with tempfile.TemporaryDirectory(prefix="nplm-model-") as tmp:
        folder = Path(tmp)
        reading = folder / "reading.json"
        reading.write_text(
            json.dumps(
                {"vocab": list(corpus.vocab), "data": OmegaConf.to_container(data, resolve=True), "module": module}
            )
        )
        python_model = NextWords()
        python_model.load_context(
            mlflow.pyfunc.PythonModelContext({WEIGHTS: str(checkpoint), READING: str(reading)}, None)
        )
        inferred = infer_signature(EXAMPLE, python_model.predict(None, EXAMPLE), params={"k": 10})
        inputs = Schema([ColSpec(DataType.string, "context"), ColSpec(DataType.string, "next_word", required=False)])
        signature = ModelSignature(inputs, inferred.outputs, inferred.params)
        mlflow.pyfunc.save_model(
            folder / MODEL,
            python_model=NextWords(),
            artifacts={WEIGHTS: str(checkpoint), READING: str(reading)},
            code_paths=[str(_code(folder))],
            signature=signature,
            input_example=EXAMPLE,
            pip_requirements=requirements(),
        )
        logged = client.create_logged_model(run.info.experiment_id, name=MODEL, source_run_id=run_id)
        try:
            client.log_model_artifacts(logged.model_id, str(folder / MODEL))
        except BaseException:
            client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
            raise
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return logged.model_id


def model_of(client: mlflow.MlflowClient, run_id: str) -> str | None:
    """The id of the run's READY Model that holds its weights, or None (a run from before runs logged one, one
    without weights, or a Model whose checkpoint was deleted from the artifact store)."""
    run = client.get_run(run_id)
    found = client.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run_id}' AND name = '{MODEL}'",
        max_results=1,
    )
    ready = [m.model_id for m in found if m.status == LoggedModelStatus.READY]
    if not ready or not any(
        f.path.endswith(".ckpt") for f in client.list_logged_model_artifacts(ready[0], "artifacts")
    ):
        return None
    return ready[0]
